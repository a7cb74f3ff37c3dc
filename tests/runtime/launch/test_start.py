"""Tests of the start of the ranks (multigpu.runtime.launch._start, which spawn
uses as parent.start_rank): the deadline bounds it too, even when the forkserver
that starts them does not answer."""

import os
import signal
import subprocess
import threading
import time
from multiprocessing import forkserver

import psutil
import pytest

from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime.launch import DeadlineExceededError, parent, spawn
from tests.runtime.launch.processes import SLACK, gone


class _SlowStart:
    """A process whose start() waits until the test releases it."""

    def __init__(self):
        self.release = threading.Event()
        self.killed = threading.Event()

    def start(self):
        self.release.wait(timeout=60)

    def kill(self):
        self.killed.set()

    def join(self):
        pass


class _Pipe:
    closed = False

    def close(self):
        self.closed = True


def test_a_start_that_outlasts_the_deadline_is_given_up_and_ended_later():
    process, pipe = _SlowStart(), _Pipe()
    started = time.monotonic()
    why = parent.start_rank(process, time.monotonic() + 0.2, [pipe])
    assert why == ""  # given up; the forkserver (if any) was not stopped
    assert time.monotonic() - started < 0.2 + SLACK
    assert not process.killed.is_set() and not pipe.closed  # its start still runs
    process.release.set()  # it starts, too late
    assert process.killed.wait(timeout=SLACK)
    assert pipe.closed


def test_a_stopped_forkserver_is_ended_and_a_running_one_is_not(monkeypatch):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:  # the sleeper stands in for this process's forkserver
        server = forkserver._forkserver
        monkeypatch.setattr(server, "_forkserver_pid", sleeper.pid)
        assert not parent.end_stopped_forkserver()
        assert sleeper.poll() is None
        os.kill(sleeper.pid, signal.SIGSTOP)
        assert _wait_until(lambda: psutil.Process(sleeper.pid).status() == "stopped")
        assert parent.end_stopped_forkserver()
        # Already exited, not reaped: multiprocessing reaps it, then starts another.
        assert psutil.Process(sleeper.pid).status() == "zombie"
        assert sleeper.wait(timeout=SLACK) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()


def _wait_until(condition) -> bool:
    give_up = time.monotonic() + SLACK
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.skipif(
    parent.START_METHOD != "forkserver", reason="only a forkserver starts the ranks"
)
def test_a_stopped_forkserver_cannot_hold_a_launch_past_its_deadline(monkeypatch):
    spawn(collective_ranks.whoami_rank, 1)  # the forkserver runs
    server = forkserver._forkserver._forkserver_pid
    # As if it were stopped after spawn looked (spawn ends one that is stopped).
    monkeypatch.setattr(parent, "end_stopped_forkserver", lambda: False, raising=False)
    os.kill(server, signal.SIGSTOP)
    outcome = {}

    def launch():
        try:
            outcome["result"] = spawn(collective_ranks.whoami_rank, 2, deadline=1.0)
        except Exception as exc:
            outcome["error"] = exc

    caller = threading.Thread(target=launch, daemon=True)
    caller.start()
    caller.join(timeout=1.0 + SLACK)
    hung = caller.is_alive()
    if hung:  # it used to wait for the stopped forkserver forever
        os.kill(server, signal.SIGCONT)
        caller.join(timeout=60)
    assert not hung, "spawn(deadline=1.0) was still starting its ranks"
    error = outcome.get("error")
    assert isinstance(error, DeadlineExceededError)
    assert str(error).startswith(
        "The launch did not finish within its deadline of 1 s: it had started only "
        "0 of 2 ranks (the forkserver that starts the ranks was stopped (SIGSTOP)"
    )
    assert gone(server)
    monkeypatch.undo()
    # As the message says, the next launch starts a new forkserver.
    assert len(spawn(collective_ranks.whoami_rank, 1)) == 1
