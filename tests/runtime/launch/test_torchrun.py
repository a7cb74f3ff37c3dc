"""Tests for multigpu.runtime.launch.torchrun: run_torchrun, exit_rank, and the
torchrun example multigpu.ranks.torchrun_example."""

import inspect
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from multigpu.ranks import torchrun_example
from multigpu.runtime.launch import (
    TORCHRUN_DEADLINE_S,
    TorchrunError,
    run_torchrun,
    start_torchrun,
    stop_torchrun,
)
from tests.runtime.launch.processes import SLACK, descendants, gone


def test_run_torchrun_returns_the_output_of_the_ranks(no_leftovers):
    result = run_torchrun("multigpu.ranks.torchrun_example", 2)
    assert result.returncode == 0
    assert "world_size=2 sum=3 threads=1" in result.stdout


needs_proc = pytest.mark.skipif(
    torchrun_example.native_threads() is None, reason="counts threads via /proc"
)


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@needs_proc
def test_ddp_keeps_the_gloo_threads_after_destroy_process_group(no_leftovers):
    # The first link in exit_rank's chain of causes: once DDP was built, the
    # group's worker threads outlive destroy_process_group (and a garbage
    # collection). If a PyTorch release changes that, exit_rank's docstring and
    # notebook 09's explanation need another look.
    result = run_torchrun("multigpu.ranks.torchrun_example", 2, "ddp-exit")
    line = next(x for x in result.stdout.splitlines() if "native threads" in x)
    before, during, after = (int(word) for word in line.split() if word.isdigit())
    assert during > before
    assert after == during


@needs_proc
def test_without_ddp_destroy_process_group_ends_the_gloo_threads():
    script = (
        "import torch, torch.distributed as dist\n"
        "from multigpu.ranks.torchrun_example import native_threads as count\n"
        "torch.ones(2).sum(); before = count()\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, "
        "world_size=1)\n"
        "t = torch.ones(2); dist.all_reduce(t); during = count()\n"
        "dist.destroy_process_group(); print(before, during, count())\n"
    )
    done = _run_python(script)
    before, during, after = map(int, done.stdout.split())
    assert during > before
    assert after == before


def test_exit_rank_flushes_the_output_and_keeps_the_exit_status():
    script = (
        "import sys\n"
        "from multigpu.runtime.launch import exit_rank\n"
        "print('to stdout', end='')\n"
        "print('to stderr', end='', file=sys.stderr)\n"
        "exit_rank(3)\n"
    )
    done = _run_python(script)
    assert (done.returncode, done.stdout, done.stderr) == (3, "to stdout", "to stderr")


def test_ranks_ending_with_exit_rank_never_abort(no_leftovers):
    # Without exit_rank, 4 such ranks aborted in 1 launch of 30 and 1 of 40 on a
    # 2-core machine (bench/exit_abort.py, which counts over many launches): too rare
    # to show in a test, so one launch here checks that the ranks end cleanly.
    result = run_torchrun(
        "multigpu.ranks.torchrun_example",
        4,
        "ddp-exit",
        "exit_rank",
        check=False,
    )
    output = result.stdout + result.stderr
    assert "terminate called" not in output
    assert result.returncode == 0, output[-2000:]
    assert "after destroy_process_group" in result.stdout


def test_run_torchrun_stops_a_run_that_takes_too_long():
    before = descendants()
    with pytest.raises(TorchrunError, match="did not finish within 0.5 s"):
        run_torchrun("multigpu.ranks.torchrun_example", 1, deadline=0.5)
    assert descendants() - before == set()


def test_run_torchrun_takes_a_deadline_and_refuses_a_timeout():
    # timeout means each collective's bound (spawn's timeout=); the whole run's
    # bound is deadline=, so a timeout= here must not quietly bound the whole run.
    before = descendants()
    with pytest.raises(TypeError) as refused:
        run_torchrun("multigpu.ranks.torchrun_example", 1, timeout=120)
    assert str(refused.value) == (
        "run_torchrun() takes deadline=, not timeout=: deadline bounds the whole "
        "run, timeout each collective (as in spawn). Pass deadline=120 instead of "
        "timeout=120."
    )
    assert descendants() - before == set()  # refused before anything started
    default = inspect.signature(run_torchrun).parameters["deadline"].default
    assert default == TORCHRUN_DEADLINE_S


# run_torchrun's deadline in the tests of a stopped rank: torchrun must have started
# a rank well before it, and under make test's load its agent once took more than
# 10 s to import torch and start one.
RUN_DEADLINE = 20.0
# How long torchrun may take to start its first rank where nothing else bounds it.
FIRST_RANK_WITHIN_S = 30.0
TRAINING = ("multigpu.ddp", 2, "--epochs", "50")  # far longer than RUN_DEADLINE


def _torchrun_started_by_this_process(within_s: float) -> psutil.Process:
    give_up = time.monotonic() + within_s
    while time.monotonic() < give_up:
        for child in psutil.Process().children():
            try:
                if "torch.distributed.run" in child.cmdline():
                    return child
            except psutil.Error:
                pass
        time.sleep(0.1)
    raise AssertionError(f"no torchrun started within {within_s} s")


def _command_line(process: psutil.Process) -> list[str]:
    """``process``'s command line; [] for one that has just exited (a zombie)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _stop_a_rank(torchrun: psutil.Process, within_s: float) -> list[psutil.Process]:
    """SIGSTOP the first rank torchrun starts; return torchrun's tree, the stopped
    rank first."""
    give_up = time.monotonic() + within_s
    while time.monotonic() < give_up:
        ranks = [
            child
            for child in torchrun.children()
            if "multigpu.ddp" in _command_line(child)
            and "torch.distributed.run" not in _command_line(child)
        ]
        if ranks:
            ranks[0].suspend()  # SIGSTOP
            others = torchrun.children(recursive=True)
            return ranks[:1] + [p for p in others if p != ranks[0]] + [torchrun]
        time.sleep(0.1)
    raise AssertionError(f"torchrun started no rank within {within_s} s")


def _left(processes: list[psutil.Process]) -> list[int]:
    """The pids of ``processes`` still running (stopped counts); kill those, so a
    failing test leaves nothing either."""
    left = [process.pid for process in processes if not gone(process.pid, 1.0)]
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    return left


def test_the_deadline_of_run_torchrun_bounds_a_run_with_a_stopped_rank():
    # A stopped rank holds torchrun's output pipes and never answers SIGTERM: the
    # run must still end at the deadline, with every process it started.
    outcome: dict = {}

    def run() -> None:
        started = time.monotonic()
        try:
            run_torchrun(*TRAINING, deadline=RUN_DEADLINE)
        except TorchrunError as error:
            outcome["error"] = str(error)
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    torchrun = _torchrun_started_by_this_process(RUN_DEADLINE)
    processes = _stop_a_rank(torchrun, RUN_DEADLINE)
    thread.join(RUN_DEADLINE + SLACK)
    returned = not thread.is_alive()
    left = _left(processes)
    thread.join(SLACK)  # the processes are gone: a run_torchrun that hung ends
    assert returned, f"run_torchrun did not return within {RUN_DEADLINE + SLACK} s"
    assert outcome["error"] == (
        f"torchrun -m multigpu.ddp did not finish within {RUN_DEADLINE} s and was "
        "stopped. Raise deadline=, or look for a rank that never joins."
    )
    assert RUN_DEADLINE <= outcome["seconds"] < RUN_DEADLINE + SLACK
    assert left == []


def test_stop_torchrun_ends_a_stopped_rank_within_its_grace(tmp_path):
    with open(tmp_path / "torchrun.log", "w") as log:
        process = start_torchrun(*TRAINING, output=log)
    try:
        processes = _stop_a_rank(psutil.Process(process.pid), FIRST_RANK_WITHIN_S)
        started = time.monotonic()
        stop_torchrun(process, grace=1.0)
        seconds = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert _left(processes) == []
    assert seconds < 1.0 + SLACK
