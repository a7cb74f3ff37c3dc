"""The DDP torchrun script: runs under torchrun, says to use it otherwise; from a
shell, a wrong option is one line, and every command its docstrings print runs.
Notebook 11's script, built on this one, is tested in tests/snapshot/test_main.py."""

import importlib
import os
import shlex
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from multigpu import ddp
from multigpu.runtime.launch import run_torchrun
from tests.ddp.scripts import (
    SHELL_TIMEOUT,
    as_rank_0_of,
    check_one_line,
    configuration_walk,
    docstring_commands,
    one_rank_runner,
)
from tests.faults.leftovers import run_shell


def test_read_rank_env_says_to_use_torchrun():
    env = ddp.read_rank_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert env == ddp.RankEnv(rank=1, local_rank=1, world_size=2)
    with pytest.raises(ddp.NotLaunchedByTorchrunError, match="torchrun --standalone"):
        ddp.read_rank_env({})


def test_plain_python_exits_with_code_2_and_says_to_use_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ddp.ENV_NAMES}
    done = subprocess.run(
        [sys.executable, "-m", "multigpu.ddp", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: RANK, LOCAL_RANK, WORLD_SIZE not set")
    assert ddp.COMMAND in done.stderr


def test_nccl_with_more_local_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ddp.NotEnoughGPUsError) as raised:
        ddp.setup("nccl")
    assert str(raised.value) == (
        "nccl needs one GPU per rank, but this is local rank 1 on a machine with "
        "1 GPU(s) visible. Start at most 1 processes per node (torchrun "
        "--nproc-per-node=1), or pass --backend gloo."
    )
    assert not dist.is_initialized()


def test_torchrun_runs_the_script(tmp_path):
    result = run_torchrun(
        "multigpu.ddp",
        2,
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--lr",
        "0.2",
        "--no-progress",
        "--checkpoint",
        tmp_path / "last.pt",
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "2 ranks (gloo), global batch 256 = 2 x 128, lr 0.2"
    assert lines[1].startswith("epoch 1/1: train loss ")
    assert lines[-1] == "every rank holds the same weights: True"
    assert (tmp_path / "last.pt").exists()


SCRIPT = "torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --no-progress"
PROG = "torchrun --standalone --nproc-per-node=N -m multigpu.ddp"


WRONG_OPTIONS = [
    (
        "--epochs 0",
        "--epochs must be an integer of at least 1, got 0. Pass e.g. --epochs 5.",
    ),
    (
        "--epochs -1",
        "--epochs must be an integer of at least 1, got -1. Pass e.g. --epochs 5.",
    ),
    (
        "--batch-size 0",
        "--batch-size must be an integer of at least 1, got 0. "
        "Pass e.g. --batch-size 64.",
    ),
    ("--lr nan", "--lr must be a finite number, got nan. Pass e.g. --lr 0.05."),
    (
        "--accumulation 0",
        "--accumulation must be an integer of at least 1, got 0."
        " Pass 1 for no accumulation.",
    ),
    (
        "--momentum -1",
        "--momentum must not be negative, got -1.0. Pass e.g. "
        "--momentum 0.9, or 0 for none.",
    ),
    (
        "--samples 10",
        "--samples 10 gives 10 samples, fewer than one global batch "
        "(--batch-size 64) on 2 ranks: no rank would train a single step. "
        "Pass more --samples or a smaller --batch-size.",
    ),
    (
        "--checkpoint /sys/last.pt",
        "--checkpoint /sys/last.pt: cannot write a file "
        "in /sys (permission denied). Pass a --checkpoint path in a folder you can "
        "write to, with space left.",
    ),
    (
        "--accumulation 3",
        "--accumulation 3 does not split a per-rank batch of 32 into equal "
        "micro-batches. Pass a --batch-size that is a multiple of 2 ranks x 3 = 6, "
        "or another --accumulation.",
    ),
    (
        "--step-delay 0.1",
        "--step-delay is an option of notebook 11's script, which snapshots: pass it "
        "to -m multigpu.snapshot instead of -m multigpu.ddp.",
    ),
    (
        "--resume",
        "--resume needs --checkpoint FILE: the file it resumes from (and saves to "
        "after every epoch). Add --checkpoint FILE, or leave --resume out.",
    ),
    (
        "--timeout 1e300",
        "--timeout must be from 1 to 604800 seconds (a week), got 1e+300. Pass e.g. "
        "--timeout 60.",
    ),
]
# From a shell under torchrun: an option argparse refuses, one that does not fit the
# data (one that does not fit the ranks torchrun started: tests/snapshot/test_main.py).
FROM_A_SHELL = ("--epochs 0", "--samples 10")


@pytest.mark.parametrize("options, message", WRONG_OPTIONS)
def test_a_wrong_option_is_one_line_before_the_group_starts(
    tmp_path, monkeypatch, capsys, options, message
):
    """The script's main on rank 0 of 2, as torchrun starts it, in this process."""
    as_rank_0_of(2, monkeypatch, tmp_path)
    main = importlib.import_module(MAIN).main
    with pytest.raises(SystemExit) as exited:
        main(["--no-progress", *shlex.split(options)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{PROG}: error: {message}\n"
    assert not dist.is_initialized()


def test_the_configuration_is_walked_without_coming_back_to_the_script(
    tmp_path, monkeypatch
):
    """Every option is checked below ``__main__``: control leaves it once, and comes
    back only to train (here, where it joins the process group, it is stopped)."""
    as_rank_0_of(2, monkeypatch, tmp_path)
    main = importlib.import_module(MAIN).main
    walk = configuration_walk(main, ["--samples", "256", "--no-progress"])
    assert walk.count(MAIN) == 1 and walk[0] == MAIN, walk


@pytest.mark.parametrize(
    "options, message", [case for case in WRONG_OPTIONS if case[0] in FROM_A_SHELL]
)
def test_a_wrong_option_is_one_line_from_torchrun(tmp_path, options, message):
    code, output = run_shell(f"{SCRIPT} {options}", SHELL_TIMEOUT, cwd=tmp_path)
    check_one_line(code, output, f"{PROG}: error: {message}")


def _unshare_works():
    try:
        done = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rm (user namespaces)")
@pytest.mark.parametrize(
    "prepare, reason",
    [
        ("mount -o remount,ro D", "read-only file system"),
        ("head -c 1M /dev/zero > D/fill 2>/dev/null", "no space left on device"),
    ],
)
def test_a_checkpoint_folder_that_takes_no_file_is_one_line(tmp_path, prepare, reason):
    """A read-only or full file system: a 64 KiB tmpfs of the test's own (a user and
    mount namespace), refused before the process group starts."""
    disk = tmp_path / "disk"
    disk.mkdir()
    inside = f"mount -t tmpfs -o size=64k tmpfs D; {prepare}; {SCRIPT} "
    inside += "--checkpoint D/last.pt"
    code, output = run_shell(
        f"unshare -rm sh -c {shlex.quote(inside.replace('D', str(disk)))}",
        SHELL_TIMEOUT,
        cwd=tmp_path,
    )
    check_one_line(
        code,
        output,
        f"{PROG}: error: --checkpoint {disk}/last.pt: cannot write a file in {disk} "
        f"({reason}). Pass a --checkpoint path in a folder you can write to, with "
        "space left.",
    )


MAIN = "multigpu.ddp.__main__"
COMMANDS = sorted(
    {
        command
        for name in ("multigpu.ddp", MAIN)
        for command in docstring_commands(importlib.import_module(name).__doc__)
    }
)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_in_the_docstrings_runs_from_a_shell(tmp_path, command):
    code, output = run_shell(command, 2 * SHELL_TIMEOUT, cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert output.splitlines()[-1] == "every rank holds the same weights: True"


def test_nccl_without_a_gpu_says_so_and_to_use_gloo(tmp_path, monkeypatch, capsys):
    """Rank 0 of 2 on a machine without a GPU: one line, before the group starts."""
    as_rank_0_of(2, monkeypatch, tmp_path)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    main = importlib.import_module(MAIN).main
    with pytest.raises(SystemExit) as exited:
        main(["--no-progress", "--backend", "nccl"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"{PROG}: error: --backend nccl needs a GPU for every rank, and this machine "
        "has no GPU (torch.cuda.device_count() is 0). Pass --backend gloo, or leave "
        "--backend out: auto picks gloo where there is no GPU.\n"
    )
    assert not dist.is_initialized()


@pytest.fixture
def script(tmp_path, monkeypatch, capsys):
    """The script's main in this process as the only rank of a gloo group."""
    main = importlib.import_module(MAIN).main
    small = ["--no-progress", "--backend", "gloo", "--samples", "64", "--epochs", "1"]
    return one_rank_runner(main, monkeypatch, tmp_path, capsys, *small)


def test_a_finished_run_says_so_and_another_lr_is_refused(script):
    """--checkpoint with --resume: a rerun of a finished run trains nothing and says
    so; a rerun with another --lr is one line."""
    code, out, _ = script("--checkpoint", "last.pt")
    assert code == 0 and out[-1] == "every rank holds the same weights: True"
    code, out, _ = script("--checkpoint", "last.pt", "--resume")
    assert code == 0
    assert out[1:] == [
        "the run is already complete: last.pt is of epoch 1, and this run asks for 1 "
        "epoch(s), so there is nothing to train. Use a new checkpoint file to train "
        "again, or more epochs to train on.",
        "every rank holds the same weights: True",
    ]
    code, _, err = script("--checkpoint", "last.pt", "--resume", "--lr", "0.5")
    assert code == 2
    assert err == [
        "error: last.pt was saved by a run whose optimizer had lr 0.05, and this run "
        "asks for 0.5: resuming would train with 0.05. Resume with lr 0.05, or start "
        "afresh with a new checkpoint file."
    ]


def test_weights_that_are_not_finite_fail_in_one_line(script):
    code, out, err = script("--lr", "1e30", "--epochs", "2")  # 2 steps: nan
    assert code == 1
    assert not any("same weights" in line for line in out)
    assert len(err) == 1 and err[0].startswith(
        "every rank holds the same weights: True, but they are not finite (nan or "
        "inf, first in "
    )
