"""The watchdog of one launch: a small process that kills the ranks if the caller dies.

Each rank also watches a lifeline (see _child), but that is a Python thread: it
cannot run while the rank is stopped (SIGSTOP) or sits in a long C call that holds
the GIL. The watchdog needs nothing from the ranks. spawn starts it (``Watchdog``)
and writes each rank's pid to its stdin, one per line; "done" ends it quietly. End
of file without "done" means the caller died (the operating system closed the pipe):
the watchdog then stops every rank, kills its process group and everything below
it, a process in a session of its own too (_process_tree), with SIGKILL, which ends
stopped processes too, and exits. Run as a script (``python -I -S _watchdog.py``),
it imports only the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

if __package__:
    from multigpu.runtime.launch import _process_tree
else:  # run as a script (python -I -S): _process_tree needs only the stdlib
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _process_tree

_DONE = b"done"


def _kill_ranks(ranks: dict[int, str | None]) -> None:
    """Kill each rank (stopped first), its process group and everything below it,
    a process in a session of its own too. A group outlives its leader while a
    member lives, and its id is not reused; a rank's pid that now belongs to
    another process is left alone."""
    groups = []
    processes = set()
    for pid, started in ranks.items():
        now = _process_tree.process(pid)
        if now is not None and now[1] != started:
            continue  # the rank is gone and its pid belongs to another process
        groups.append(pid)
        if now is not None:
            processes.add(now)
    _process_tree.end_processes(processes, groups if hasattr(os, "killpg") else [])


def main() -> None:
    """Collect pids from stdin until "done" (return) or end of file (kill them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ranks: dict[int, str | None] = {}
    pending = b""
    while chunk := os.read(0, 4096):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line == _DONE:
                return
            found = _process_tree.process(int(line))
            ranks[int(line)] = None if found is None else found[1]
    _kill_ranks(ranks)


class Watchdog:
    """The caller's side: start the watchdog, tell it each rank, end it (POSIX only:
    elsewhere it does nothing)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        if os.name == "posix":
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C or a killed group spares it
            )

    def _send(self, line: bytes) -> None:
        if self._process is not None and self._process.stdin is not None:
            try:  # one write of a short line: the watchdog never reads half of it
                os.write(self._process.stdin.fileno(), line + b"\n")
            except OSError:  # the watchdog is gone: the lifelines remain
                pass

    def watch(self, pid: int) -> None:
        self._send(str(pid).encode())

    def close(self) -> None:
        """Tell the watchdog the ranks are ended and reaped, and reap it."""
        if self._process is None:
            return
        self._send(_DONE)
        self._process.stdin.close()
        try:
            self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


if __name__ == "__main__":
    main()
