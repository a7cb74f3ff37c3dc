"""The processes a process started, and how to end them all (spawn's and torchrun's
ranks).

A process group does not hold everything: torchrun starts each worker in a session
of its own, and so does a worker's ``subprocess.Popen(..., start_new_session=True)``.
So whoever ends a launch looks for the processes *below* it (``descendants``: on
Linux from ``/proc/PID/task/*/children``, else from the whole process table) and
ends them all (``end_processes``): first stopped (SIGSTOP), so that none forks
meanwhile, then looked for again, then killed (SIGKILL, which ends stopped
processes too). A process is known by its pid and its start time, so a pid the
system gave to a new process is never killed. What this cannot find: a process
whose parent had already exited (it then belongs to init), for example the child of
a rank that was killed from outside. The watchdog runs this file from its own
folder, so it imports only the standard library.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable

Process = tuple[int, str]  # (pid, start time): one process, even after pid reuse
Table = dict[int, tuple[int, str]]  # pid -> (parent pid, start time)
_PROC = os.path.isdir("/proc")


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of ``pid`` from /proc, None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:  # it has just exited
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[1]), fields[19].decode()


def _table() -> Table:
    """pid -> (parent pid, start time) of every process (Linux: /proc; else ps)."""
    table: Table = {}
    if _PROC:
        for name in os.listdir("/proc"):
            if name.isdigit() and (found := _stat(int(name))) is not None:
                table[int(name)] = found
        return table
    listing = subprocess.run(
        ["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "lstart="],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in listing.splitlines():
        pid, ppid, started = line.split(None, 2)
        table[int(pid)] = (int(ppid), started.strip())
    return table


def _children(pid: int) -> list[int] | None:
    """The children of ``pid`` (Linux), [] once it has gone, None where the kernel
    does not list them (then the whole table is read instead)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return [] if _PROC else None
    children: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                children += [int(child) for child in handle.read().split()]
        except FileNotFoundError:
            if not os.path.isdir(f"/proc/{pid}/task/{task}"):
                continue  # that thread has ended
            return None  # a kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return children


def descendants(pid: int, table: Table | None = None) -> set[Process]:
    """Every live process below ``pid`` (children, their children, ...), as
    (pid, start time) pairs."""
    found: set[Process] = set()
    stack = [pid]
    if table is None:
        while stack:
            children = _children(stack.pop())
            if children is None:
                return descendants(pid, _table())
            for child in children:
                stat = _stat(child)
                if stat is not None and (child, stat[1]) not in found:
                    found.add((child, stat[1]))
                    stack.append(child)
        return found
    below: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        below.setdefault(parent, []).append(child)
    while stack:
        for child in below.get(stack.pop(), []):
            if (child, table[child][1]) not in found:
                found.add((child, table[child][1]))
                stack.append(child)
    return found


def _snapshot() -> Table | None:
    """None on Linux (each process is read from /proc when needed), else the whole
    table, read once (one ``ps``)."""
    return None if _PROC else _table()


def _row(pid: int, table: Table | None) -> tuple[int, str] | None:
    return _stat(pid) if table is None else table.get(pid)


def alive(process_: Process, table: Table | None = None) -> bool:
    """True while ``process_`` runs (or is a zombie) under the same pid."""
    row = _row(process_[0], _snapshot() if table is None else table)
    return row is not None and row[1] == process_[1]


def process(pid: int) -> Process | None:
    """``pid`` as a (pid, start time) pair, None once it has gone."""
    row = _row(pid, _snapshot())
    return None if row is None else (pid, row[1])


def _signal(process_: Process, signum: int, table: Table | None) -> None:
    if alive(process_, table):
        try:
            os.kill(process_[0], signum)
        except OSError:
            pass


_ROUNDS = 5  # end_processes: how often to look again for processes forked meanwhile


def end_processes(processes: Iterable[Process], groups: Iterable[int] = ()) -> None:
    """SIGKILL ``processes``, everything below them, and the process ``groups``.
    All are first stopped (SIGSTOP) and looked for again, so that no process
    forked meanwhile escapes."""
    table = _snapshot()
    found = {process_ for process_ in processes if alive(process_, table)}
    stopped: set[Process] = set()
    for _ in range(_ROUNDS):
        if found <= stopped:
            break
        for process_ in found - stopped:
            _signal(process_, signal.SIGSTOP, table)
            stopped.add(process_)
        table = _snapshot()
        for process_ in list(found):
            if alive(process_, table):  # a pid given to another process: not ours
                found |= descendants(process_[0], table)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    table = _snapshot()
    for process_ in found:
        _signal(process_, signal.SIGKILL, table)


def end_descendants() -> None:
    """SIGKILL every process below this one (a rank ends what it started)."""
    end_processes(descendants(os.getpid()))


def kill_tree(root: subprocess.Popen, known: set[Process] = frozenset()) -> None:
    """SIGKILL ``root``, its process group, everything below it, and the ``known``
    processes (noted earlier with ``descendants``) with everything below them; then
    reap ``root``."""
    processes = set(known)
    running = root.returncode is None  # not reaped: its pid is still its own
    if running and (found := process(root.pid)) is not None:
        processes.add(found)
    # root leads its own process group (start_new_session)
    end_processes(processes, [root.pid] if running and hasattr(os, "killpg") else [])
    if root.poll() is None:
        root.kill()
    root.wait()
