"""The torchrun script: runs under torchrun, says to use it otherwise; from a shell,
a wrong option is one line, and every command its docstrings print runs."""

import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from multigpu import ddp
from multigpu.runtime.launch import run_torchrun
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
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "2 ranks (gloo), global batch 256 = 2 x 128, lr 0.2"
    assert lines[1].startswith("epoch 1/1: train loss ")
    assert lines[-1] == "every rank holds the same weights: True"
    assert (tmp_path / "last.pt").exists()


SCRIPT = "torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --no-progress"
PROG = "torchrun --standalone --nproc-per-node=N -m multigpu.ddp"
SHELL_TIMEOUT = 240  # one torchrun run from a shell on a busy 2-core machine


def _script_errors(output):
    """The ranks' one-line errors: the usage errors and ``rank R: ...`` lines."""
    lines = output.splitlines()
    return [line for line in lines if ": error: " in line or line.startswith("rank ")]


def _check_one_line(code, output, expected):
    assert _script_errors(output) == [expected], output[-3000:]
    assert not any(line.startswith("[rank") for line in output.splitlines())
    assert "exitcode  : 2" in output  # torchrun's summary: the ranks' status
    assert code == 1  # torchrun's own: a rank failed


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
        "--snapshot s --kill-rank 5 --kill-at-step 3",
        "--kill-rank 5 is not a rank of this run: torchrun started 2 (0 to 1). "
        "Pass a rank from 0 to 1, or start more ranks.",
    ),
    (
        "--snapshot s --kill-rank 1 --kill-at-step -4",
        "--kill-at-step must be 0 or "
        "more, got -4. Pass the steps done before it dies, e.g. --kill-at-step 1.",
    ),
    (
        "--snapshot s --samples 256 --epochs 2 --kill-rank 1 --kill-at-step 8",
        "--kill-at-step 8 never comes: this run trains 8 steps (2 epochs of 4), so "
        "the fault would not fire. Pass a step from 0 to 7.",
    ),
]
WRONG_OPTIONS += [
    (
        "--step-delay 0.1",
        "--step-delay needs --snapshot DIR: it slows the snapshot loop down, which "
        "runs only with a snapshot folder. Add --snapshot DIR, or leave --step-delay "
        "out.",
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
# data, one that does not fit the ranks torchrun started.
FROM_A_SHELL = (
    "--epochs 0",
    "--samples 10",
    "--snapshot s --kill-rank 5 --kill-at-step 3",
)


@pytest.mark.parametrize("options, message", WRONG_OPTIONS)
def test_a_wrong_option_is_one_line_before_the_group_starts(
    tmp_path, monkeypatch, capsys, options, message
):
    """The script's main on rank 0 of 2, as torchrun starts it, in this process."""
    monkeypatch.chdir(tmp_path)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    main = importlib.import_module(MAIN).main
    with pytest.raises(SystemExit) as exited:
        main(["--no-progress", *shlex.split(options)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{PROG}: error: {message}\n"
    assert not dist.is_initialized()
    assert not (tmp_path / "s").exists()  # stopped before the loop made it


@pytest.mark.parametrize(
    "options, message", [case for case in WRONG_OPTIONS if case[0] in FROM_A_SHELL]
)
def test_a_wrong_option_is_one_line_from_torchrun(tmp_path, options, message):
    code, output = run_shell(f"{SCRIPT} {options}", SHELL_TIMEOUT, cwd=tmp_path)
    _check_one_line(code, output, f"{PROG}: error: {message}")
    assert not (tmp_path / "s").exists()  # stopped before the loop made it


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
    _check_one_line(
        code,
        output,
        f"{PROG}: error: --checkpoint {disk}/last.pt: cannot write a file in {disk} "
        f"({reason}). Pass a --checkpoint path in a folder you can write to, with "
        "space left.",
    )


def docstring_commands(text):
    """The shell commands in a docstring: lines that start with ``torchrun`` or
    with a variable and then ``torchrun``, with their ``\\`` continuations."""
    commands, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and re.match(r"^(\w+=\S+ )*torchrun ", stripped):
            current = ""
        if current is not None:
            current += stripped.rstrip("\\").strip() + " "
            if not stripped.endswith("\\"):
                commands.append(current.strip())
                current = None
    return commands


MAIN = "multigpu.ddp.__main__"
MODULES_WITH_COMMANDS = ["multigpu.ddp", MAIN, "multigpu.snapshot"]
COMMANDS = sorted(
    {
        command
        for name in MODULES_WITH_COMMANDS
        for command in docstring_commands(importlib.import_module(name).__doc__)
    }
)


def test_the_docstrings_print_the_commands_a_learner_pastes():
    assert any("--max-restarts" in command for command in COMMANDS)
    for command in COMMANDS:
        if "--max-restarts" in command:
            assert command.startswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "), command


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_in_the_docstrings_runs_from_a_shell(tmp_path, command):
    command = command.replace("DIR", str(tmp_path / "snapshots"))
    code, output = run_shell(command, 2 * SHELL_TIMEOUT, cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert output.splitlines()[-1] == "every rank holds the same weights: True"
    if "--kill-rank" in command:
        words = command.split()
        kill_step = int(words[words.index("--kill-at-step") + 1])
        every = 5  # the default --snapshot-every, unless the command gives it
        if "--snapshot-every" in words:
            every = int(words[words.index("--snapshot-every") + 1])
        step = kill_step // every * every
        resumed = f"restart 1: resumed from the snapshot of step {step} "
        assert any(line.startswith(resumed) for line in output.splitlines()), output


def test_restarts_without_the_own_store_variable_are_refused_with_the_command(
    tmp_path,
):
    """torchrun reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE before it starts the script,
    so the script cannot set it: it refuses to start, and gives the command."""
    main_commands = docstring_commands(importlib.import_module(MAIN).__doc__)
    (command,) = [c for c in main_commands if "--max-restarts" in c]
    command = command.replace("DIR", str(tmp_path / "snapshots"))
    without = command.removeprefix("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ")
    code, output = run_shell(without, SHELL_TIMEOUT, cwd=tmp_path)
    _check_one_line(
        code,
        output,
        f"{PROG}: error: torchrun restarts need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, "
        "which torchrun reads before it starts this script, so set it in the shell: "
        f"{command}",
    )
    assert not (tmp_path / "snapshots").exists()


def test_nccl_without_a_gpu_says_so_and_to_use_gloo(tmp_path, monkeypatch, capsys):
    """Rank 0 of 2 on a machine without a GPU: one line, before the group starts."""
    monkeypatch.chdir(tmp_path)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
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
def one_rank(tmp_path, monkeypatch):
    """The script's main in this process as the only rank of a gloo group: returns
    a function that runs it and gives (status, stdout lines, stderr lines)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    environ = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    environ.update(LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    for name, value in environ.items():
        monkeypatch.setenv(name, str(value))
    for name in ("TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    main = importlib.import_module(MAIN).main
    small = ["--no-progress", "--backend", "gloo", "--samples", "64", "--epochs", "1"]

    def run(*options):
        capsys = run.capsys
        code = main([*small, *options])
        assert not dist.is_initialized()
        out, err = capsys.readouterr()
        return code, out.splitlines(), err.splitlines()

    return run


@pytest.fixture
def script(one_rank, capsys):
    one_rank.capsys = capsys
    return one_rank


def test_a_finished_run_says_so_and_another_lr_is_refused(script):
    """--checkpoint with --resume, and --snapshot: a rerun of a finished run trains
    nothing and says so; a rerun with another --lr or --momentum is one line."""
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
    assert script("--snapshot", "s")[0] == 0
    code, out, _ = script("--snapshot", "s")
    assert code == 0 and out[1].startswith("restart 0: the run is already complete")
    assert not any(line.startswith("epoch ") for line in out)
    code, _, err = script("--snapshot", "s", "--momentum", "0")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(
        "error: snapshot.pt was written by a run with 0.9 as its optimizer's "
        "momentum, and this run has 0.0"
    )


def test_weights_that_are_not_finite_fail_in_one_line(script):
    code, out, err = script("--lr", "1e30", "--epochs", "2")  # 2 steps: nan
    assert code == 1
    assert not any("same weights" in line for line in out)
    assert len(err) == 1 and err[0].startswith(
        "every rank holds the same weights: True, but they are not finite (nan or "
        "inf, first in "
    )


def test_a_run_whose_ranks_disagreed_fails_again_when_resumed(script, tmp_path):
    """torchrun restarts a round that failed the weights check; the restart finds
    the run complete and loads one snapshot everywhere, so it would agree: the
    first round's failure, noted in the folder, makes it fail again."""
    from multigpu.snapshot import read_events, record_event

    code, _, err = script("--snapshot", "nan", "--lr", "1e30", "--epochs", "2")
    assert code == 1 and len(err) == 1
    noted = [e for e in read_events(tmp_path / "nan") if e["event"] == "weights differ"]
    assert [e["message"] for e in noted] == err
    assert script("--snapshot", "s")[0] == 0  # a good run, then an earlier failure
    line = "every rank holds the same weights: False: w differs between rank 0"
    record_event(tmp_path / "s", "weights differ", message=line)
    code, out, err = script("--snapshot", "s")
    assert code == 1 and out[1].startswith("restart 0: the run is already complete")
    assert err == [
        f"{line} (found at the end of an earlier round of the run in s, whose "
        "snapshot this one resumed: start afresh in a new snapshot folder)"
    ]
