"""The script's options: switches, and counts below one stop it."""

import argparse

import pytest

from multigpu import ddp
from multigpu.ddp import cli


def test_type_bool_trap_and_the_fix():
    trap = argparse.ArgumentParser()
    trap.add_argument("--syncBN", type=bool, default=True)
    assert trap.parse_args(["--syncBN", "False"]).syncBN is True  # bool("False")
    assert ddp.parse_args([]).sync_bn is False
    assert ddp.parse_args(["--sync-bn"]).sync_bn is True
    assert ddp.parse_args(["--no-sync-bn"]).sync_bn is False
    with pytest.raises(SystemExit):
        ddp.parse_args(["--sync-bn", "False"])  # a value is refused, not misread


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--snapshot", "d", "--snapshot-every", "0"],
            "--snapshot-every must be an integer of at least 1, got 0. Pass the "
            "number of steps between snapshots, e.g. 5.",
        ),
        (
            ["--samples", "-3"],
            "--samples must be an integer of at least 1, got -3. Pass how many "
            "training digits to use, or leave --samples out for all.",
        ),
    ],
)
def test_counts_below_one_stop_the_script_with_the_fix(capsys, argv, message):
    with pytest.raises(SystemExit) as caught:
        ddp.parse_args(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")
    assert ddp.parse_args(["--samples", "1"]).samples == 1


def _stopped(capsys, call, *args):
    """The one line a check prints as it stops the script with exit status 2."""
    with pytest.raises(SystemExit) as caught:
        call(*args)
    assert caught.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # no usage: one line
    return lines[0].removeprefix(f"{cli.PROG}: error: ")


def test_only_rank_0_of_the_first_launch_prints_a_wrong_option(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as caught:
        ddp.parse_args(["--epochs", "0"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == ""
    assert cli.speaks_for_the_run({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"})
    assert not cli.speaks_for_the_run({"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"})


def test_a_folder_that_takes_no_file_is_refused_at_start(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert _stopped(capsys, ddp.parse_args, ["--snapshot", f"{afile}/d"]) == (
        f"--snapshot {afile}/d: {afile} is a file, not a folder. Pass a --snapshot "
        "path in a folder you can write to, with space left."
    )
    assert _stopped(capsys, ddp.parse_args, ["--checkpoint", str(tmp_path)]) == (
        f"--checkpoint {tmp_path} is a folder; pass a file name. Pass a --checkpoint "
        "path in a folder you can write to, with space left."
    )
    new = tmp_path / "new" / "last.pt"
    assert ddp.parse_args(["--checkpoint", str(new)]).checkpoint == str(new)
    assert not new.parent.exists()  # checked where it will be made, not made


@pytest.mark.parametrize(
    "argv, world_size, samples, epoch_steps, message",
    [
        (
            ["--batch-size", "63"],
            2,
            1437,
            22,
            "--batch-size 63: A global batch of 63 does not split evenly over 2 ranks "
            "(63 / 2 = 31.5 samples each). Choose a global batch that is a multiple "
            "of the world size, e.g. 62 or 64.",
        ),
        (
            ["--accumulation", "3"],
            2,
            1437,
            22,
            "--accumulation 3 does not split a per-rank batch of 32 into equal "
            "micro-batches. Pass a --batch-size that is a multiple of 2 ranks x 3 = "
            "6, or another --accumulation.",
        ),
        (
            ["--batch-size", "2000"],
            2,
            1437,
            0,
            "the training set has 1437 samples, fewer than one global batch "
            "(--batch-size 2000) on 2 ranks: no rank would train a single step. Pass "
            "more --samples or a smaller --batch-size.",
        ),
        (
            ["--snapshot", "d", "--kill-rank", "2", "--kill-at-step", "0"],
            2,
            1437,
            22,
            "--kill-rank 2 is not a rank of this run: torchrun started 2 (0 to 1). "
            "Pass a rank from 0 to 1, or start more ranks.",
        ),
        (
            ["--snapshot", "d", "--kill-rank", "0", "--kill-at-step", "110"],
            2,
            1437,
            22,
            "--kill-at-step 110 never comes: this run trains 110 steps (5 epochs of "
            "22), so the fault would not fire. Pass a step from 0 to 109.",
        ),
    ],
)
def test_options_that_do_not_fit_the_run_stop_it(
    capsys, argv, world_size, samples, epoch_steps, message
):
    args = ddp.parse_args(argv)
    assert _stopped(capsys, cli.check_run, args, world_size, samples, epoch_steps) == (
        message
    )


def test_options_that_fit_the_run_pass():
    args = ddp.parse_args(
        ["--snapshot", "d", "--kill-rank", "1", "--kill-at-step", "0"]
    )
    cli.check_run(args, 2, 1437, 22)  # returns: the first step is 0, rank 1 exists


def test_restarts_need_the_workers_own_store(capsys):
    env = {"TORCHELASTIC_MAX_RESTARTS": "3", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    argv = ["--snapshot", "my dir"]
    assert _stopped(capsys, cli.check_restarts, argv, env) == (
        "torchrun restarts need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which torchrun "
        "reads before it starts this script, so set it in the shell: "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone "
        "--nproc-per-node=2 --max-restarts=3 -m multigpu.ddp --snapshot 'my dir'"
    )
    cli.check_restarts(argv, {**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    cli.check_restarts(argv, {**env, "TORCHELASTIC_MAX_RESTARTS": "0"})
    cli.check_restarts(argv, {})  # not under torchrun


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--step-delay", "0.1"],
            "--step-delay needs --snapshot DIR: it slows the snapshot loop down, which "
            "runs only with a snapshot folder. Add --snapshot DIR, or leave "
            "--step-delay out.",
        ),
        (
            ["--snapshot-every", "3"],
            "--snapshot-every needs --snapshot DIR: it is how often the snapshot loop "
            "saves, which runs only with a snapshot folder. Add --snapshot DIR, or "
            "leave --snapshot-every out.",
        ),
        (
            ["--resume"],
            "--resume needs --checkpoint FILE: the file it resumes from (and saves to "
            "after every epoch). Add --checkpoint FILE, or leave --resume out.",
        ),
        (
            ["--timeout", "1e14"],
            "--timeout must be from 1 to 604800 seconds (a week), got 1e+14. Pass "
            "e.g. --timeout 60.",
        ),
        (
            ["--timeout", "1e300"],
            "--timeout must be from 1 to 604800 seconds (a week), got 1e+300. Pass "
            "e.g. --timeout 60.",
        ),
        (
            ["--timeout", "0.001"],
            "--timeout must be from 1 to 604800 seconds (a week), got 0.001. Pass "
            "e.g. --timeout 60.",
        ),
        (
            ["--snapshot", "d", "--step-delay", "1e300"],
            "--step-delay must be from 0 to 60 seconds, got 1e+300. Pass e.g. "
            "--step-delay 0.1.",
        ),
    ],
)
def test_options_that_would_be_ignored_or_overflow_stop_the_script(
    capsys, argv, message
):
    assert _stopped(capsys, ddp.parse_args, argv) == message


def test_the_options_ranges_include_their_ends():
    assert ddp.parse_args(["--timeout", "1"]).timeout == 1
    assert ddp.parse_args(["--timeout", "604800"]).timeout == 604800
    args = ddp.parse_args(["--snapshot", "d", "--step-delay", "60"])
    assert (args.step_delay, args.snapshot_every) == (60, 5)  # the default K
    assert ddp.parse_args(["--no-resume", "--step-delay", "0"]).resume is False


@pytest.mark.parametrize(
    "backend, local_world_size, gpus, message",
    [
        (
            "nccl",
            2,
            0,
            "--backend nccl needs a GPU for every rank, and this machine has no GPU "
            "(torch.cuda.device_count() is 0). Pass --backend gloo, or leave "
            "--backend out: auto picks gloo where there is no GPU.",
        ),
        (
            "nccl",
            4,
            2,
            "--backend nccl needs a GPU for every rank: torchrun started 4 ranks on "
            "this node, which has 2 GPU(s). Pass --nproc-per-node=2 or fewer, or "
            "--backend gloo.",
        ),
        (
            "auto",
            2,
            1,
            "--backend auto, which picks nccl here, needs a GPU for every rank: "
            "torchrun started 2 ranks on this node, which has 1 GPU(s). Pass "
            "--nproc-per-node=1 or fewer, or --backend gloo.",
        ),
    ],
)
def test_a_backend_without_the_gpus_it_needs_stops_the_script(
    capsys, backend, local_world_size, gpus, message
):
    assert _stopped(capsys, cli.check_backend, backend, local_world_size, gpus) == (
        message
    )


def test_backends_that_fit_the_node_pass():
    for backend, local_world_size, gpus in [
        ("gloo", 4, 0),
        ("auto", 4, 0),
        ("auto", 2, 2),
        ("nccl", 1, 1),
    ]:
        cli.check_backend(backend, local_world_size, gpus)  # returns
