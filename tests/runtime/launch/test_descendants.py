"""Processes a rank starts in a session of their own (``start_new_session=True``),
which its process group does not hold, end with the launch: when spawn returns or
raises, and when its caller is killed (each rank's lifeline, and the watchdog, which
needs no Python in the ranks). What cannot be covered is in docs/launch.md: a
process whose parent had exited before anything looked below it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from multigpu.runtime import launch
from multigpu.runtime.launch import WorkerError, spawn
from tests.runtime.launch import session_ranks
from tests.runtime.launch.processes import SLACK, TIMEOUT, gone

ROOT = Path(__file__).resolve().parents[3]
STARTUP_S = 90.0  # the longest a script may take to start its ranks


def _kill(pids) -> None:
    """Never leave a process behind, even when a check fails."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _not_gone(pids) -> list[int]:
    return [pid for pid in pids if not gone(pid)]


def test_spawn_ends_what_each_rank_started_in_a_session_of_its_own(tmp_path):
    # Rank 0 returns, rank 1 raises, rank 2 hangs and is killed by spawn: each had
    # started a sleeper in a new session, out of reach of its process group.
    with pytest.raises(WorkerError, match="rank 1 failed after starting a process"):
        spawn(session_ranks.start_session_child_rank, 3, str(tmp_path), timeout=TIMEOUT)
    pids = [int((tmp_path / f"child.{rank}").read_text()) for rank in range(3)]
    try:
        assert _not_gone(pids) == []
    finally:
        _kill(pids)


CALLER = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})  # the ranks inherit it: they import tests

from multigpu.runtime.launch import spawn
from tests.runtime.launch import session_ranks

if __name__ == "__main__":
    spawn(session_ranks.start_session_child_and_wait_rank, 2, sys.argv[1])
"""


def test_a_killed_caller_leaves_no_process_a_rank_started_in_a_session_of_its_own(
    tmp_path,
):
    (tmp_path / "caller.py").write_text(CALLER)
    with open(tmp_path / "caller.log", "w") as log:
        caller = subprocess.Popen(
            [sys.executable, str(tmp_path / "caller.py"), str(tmp_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = []
    try:
        give_up = time.monotonic() + STARTUP_S
        while len(list(tmp_path.glob("child.?"))) < 2:
            assert caller.poll() is None, (tmp_path / "caller.log").read_text()
            assert time.monotonic() < give_up, "the ranks did not start"
            time.sleep(0.05)
        children = [int((tmp_path / f"child.{rank}").read_text()) for rank in (0, 1)]
        started = [p.pid for p in psutil.Process(caller.pid).children(recursive=True)]
        caller.kill()  # as the out-of-memory killer would: no cleanup in the caller
        assert _not_gone(children) == []
    finally:
        _kill(started)
        if caller.poll() is None:
            caller.kill()
        caller.wait()


# A stand-in for a rank in which no Python can run: it leads its own process group
# (as a rank does), starts a sleeper in a session of its own, prints its pid, waits.
FAKE_RANK = (
    "import subprocess, time\n"
    f"child = subprocess.Popen({session_ranks.SLEEPER!r}, start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def test_the_watchdog_ends_a_ranks_child_in_a_session_of_its_own():
    rank = subprocess.Popen(
        [sys.executable, "-c", FAKE_RANK],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = int(rank.stdout.readline())
    # The watchdog as spawn runs it: it reads each rank's pid on its stdin.
    program = Path(launch.__file__).parent / "_watchdog.py"
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-S", str(program)], stdin=subprocess.PIPE
    )
    try:
        watchdog.stdin.write(f"{rank.pid}\n".encode())
        watchdog.stdin.close()  # the caller died: no "done" came
        assert watchdog.wait(timeout=SLACK) == 0
        assert rank.wait(timeout=SLACK) == -signal.SIGKILL
        assert gone(child)
    finally:
        _kill([rank.pid, child, watchdog.pid])
        rank.wait()
        watchdog.wait()
