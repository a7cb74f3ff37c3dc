"""Starting one rank within the launch's deadline, even when the forkserver does not
answer.

``process.start()`` waits until the forkserver has forked the rank and sent back its
pid. A forkserver that is stopped (SIGSTOP) never answers, and a cold one takes
seconds to import torch. So spawn starts each rank in a thread and waits at most
until the deadline (``start_rank``). At the deadline a stopped forkserver is ended
(SIGKILL; multiprocessing starts a new one for the next launch); one that is only
slow goes on warming up for the next launch, and a rank it starts too late is
killed as soon as it exists. Before each launch ``end_stopped_forkserver`` ends a
forkserver that is already stopped, so that the launch starts a new one instead of
waiting on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection

_JOIN_S = 5.0  # after ending a stopped forkserver: how long its start may take to end


def _forkserver_pid() -> int | None:
    """The pid of this process's forkserver, None when none was started."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None)


def _state(pid: int) -> str:
    """The state of ``pid`` as ps shows it ("T": stopped, "Z": exited but not
    reaped), "" once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rindex(b")") + 2 :].split()[0].decode()
    except OSError:
        if os.path.isdir("/proc"):
            return ""
    return subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def end_stopped_forkserver() -> bool:
    """SIGKILL this process's forkserver if it is stopped (SIGSTOP, or a debugger
    holds it); True if it was. It is a child of this process that is not reaped
    yet, so its pid is still its own."""
    pid = _forkserver_pid()
    if pid is None or _state(pid)[:1] not in ("T", "t"):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    # Until it has exited, multiprocessing would take it for alive and connect to
    # it; once it has, multiprocessing reaps it and starts a new one. So wait,
    # without reaping it.
    give_up = time.monotonic() + _JOIN_S
    while _state(pid)[:1] not in ("", "Z") and time.monotonic() < give_up:
        time.sleep(0.005)
    return True


STOPPED_FORKSERVER = (
    "the forkserver that starts the ranks was stopped (SIGSTOP) and did not answer; "
    "it has been ended, and the next launch starts a new one"
)


def start_rank(
    process, deadline_at: float | None, close_after: Iterable[Connection] = ()
) -> str | None:
    """``process.start()``, waiting at most until ``deadline_at`` (time.monotonic(),
    None: no bound); then close ``close_after`` (the child's ends of its pipes).
    Return None once started, or why it was given up at the deadline: a string for
    the error message ("" when nothing more is known). An error of the start itself
    is raised."""
    close_after = list(close_after)
    if deadline_at is None:
        try:
            process.start()
        finally:
            _close(close_after)
        return None
    lock = threading.Lock()
    state: dict = {"done": False, "given_up": False, "error": None}

    def run() -> None:
        try:
            process.start()
        except BaseException as exc:  # handed to the caller
            state["error"] = exc
        _close(close_after)
        with lock:
            state["done"] = True
            late = state["given_up"]
        if late and state["error"] is None:
            process.kill()  # started after spawn gave up on it
            process.join()

    thread = threading.Thread(target=run, daemon=True, name="multigpu-start-rank")
    thread.start()
    try:
        thread.join(max(0.0, deadline_at - time.monotonic()))
    finally:  # a Ctrl-C too: a start that ends later is then killed
        with lock:
            state["given_up"] = not state["done"]
    if state["given_up"]:
        if end_stopped_forkserver():
            thread.join(_JOIN_S)  # its wait for the pid ends with the forkserver
            return STOPPED_FORKSERVER
        return ""
    if state["error"] is not None:
        raise state["error"]
    return None


def _close(connections: list[Connection]) -> None:
    for connection in connections:
        connection.close()
