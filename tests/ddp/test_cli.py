"""The DDP script's options: switches, counts below one and the snapshot script's
options stop it; the checks both scripts share (notebook 11's own options:
tests/snapshot/test_cli.py)."""

import argparse

import pytest

from multigpu import ddp
from multigpu.ddp import cli
from tests.ddp.refusals import stopped


def test_type_bool_trap_and_the_fix():
    trap = argparse.ArgumentParser()
    trap.add_argument("--syncBN", type=bool, default=True)
    assert trap.parse_args(["--syncBN", "False"]).syncBN is True  # bool("False")
    assert ddp.parse_args([]).sync_bn is False
    assert ddp.parse_args(["--sync-bn"]).sync_bn is True
    assert ddp.parse_args(["--no-sync-bn"]).sync_bn is False
    with pytest.raises(SystemExit):
        ddp.parse_args(["--sync-bn", "False"])  # a value is refused, not misread


def test_counts_below_one_stop_the_script_with_the_fix(capsys):
    with pytest.raises(SystemExit) as caught:
        ddp.parse_args(["--samples", "-3"])
    assert caught.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            "error: --samples must be an integer of at least 1, got -3. Pass how many "
            "training digits to use, or leave --samples out for all."
        )
    )
    assert ddp.parse_args(["--samples", "1"]).samples == 1


def _stopped(capsys, call, *args):
    return stopped(capsys, cli.PROG, call, *args)


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
    assert _stopped(capsys, ddp.parse_args, ["--checkpoint", f"{afile}/d"]) == (
        f"--checkpoint {afile}/d: {afile} is a file, not a folder. Pass a "
        "--checkpoint path in a folder you can write to, with space left."
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
            ["--batch-size", "2000"],
            2,
            1437,
            0,
            "the training set has 1437 samples, fewer than one global batch "
            "(--batch-size 2000) on 2 ranks: no rank would train a single step. Pass "
            "more --samples or a smaller --batch-size.",
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


def test_accumulation_that_does_not_split_the_batch_stops_the_script(capsys):
    args = ddp.parse_args(["--accumulation", "3"])
    assert _stopped(capsys, cli.check_accumulation, args, 2) == (
        "--accumulation 3 does not split a per-rank batch of 32 into equal "
        "micro-batches. Pass a --batch-size that is a multiple of 2 ranks x 3 = 6, or "
        "another --accumulation."
    )
    cli.check_accumulation(ddp.parse_args(["--accumulation", "2"]), 2)  # returns


def test_options_that_fit_the_run_pass():
    cli.check_run(ddp.parse_args([]), 2, 1437, 22)  # returns


def test_restarts_need_the_workers_own_store(capsys):
    env = {"TORCHELASTIC_MAX_RESTARTS": "3", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    argv = ["--checkpoint", "my dir/last.pt", "--resume"]
    assert _stopped(capsys, cli.check_restarts, argv, env) == (
        "torchrun restarts need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which torchrun "
        "reads before it starts this script, so set it in the shell: "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone "
        "--nproc-per-node=2 --max-restarts=3 -m multigpu.ddp --checkpoint "
        "'my dir/last.pt' --resume"
    )
    cli.check_restarts(argv, {**env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    cli.check_restarts(argv, {**env, "TORCHELASTIC_MAX_RESTARTS": "0"})
    cli.check_restarts(argv, {})  # not under torchrun


@pytest.mark.parametrize(
    "argv, message",
    [
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
    ],
)
def test_options_that_would_be_ignored_or_overflow_stop_the_script(
    capsys, argv, message
):
    assert _stopped(capsys, ddp.parse_args, argv) == message


def test_the_options_ranges_include_their_ends():
    assert ddp.parse_args(["--timeout", "1"]).timeout == 1
    assert ddp.parse_args(["--timeout", "604800"]).timeout == 604800
    assert ddp.parse_args(["--no-resume"]).resume is False


def test_the_snapshot_script_s_options_are_refused_naming_that_script(capsys):
    """Each option of ``python -m multigpu.snapshot`` alone (11), with a value or
    not, written ``--option value`` or ``--option=value``."""
    for argv in (
        ["--snapshot", "d"],
        ["--snapshot-every=3"],
        ["--kill-rank", "1", "--kill-at-step", "3"],
        ["--step-delay", "0.1"],
    ):
        option = argv[0].split("=")[0]
        assert _stopped(capsys, ddp.parse_args, argv) == (
            f"{option} is an option of notebook 11's script, which snapshots: pass "
            "it to -m multigpu.snapshot instead of -m multigpu.ddp."
        )
    assert _stopped(capsys, ddp.parse_args, ["--snapshots", "d"]) == (
        "unrecognized arguments: --snapshots d"  # not one of them: argparse's line
    )


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
