"""The processes another process started, and how to end them all (torchrun's ranks).

torchrun starts each worker in a session of its own, so killing torchrun's process
group misses them, and once torchrun has died they are no longer its children. So
whoever runs torchrun notes its descendants while it runs (``descendants``) and, to
end the run, kills torchrun and everything it started (``kill_tree``): stopped
processes included, since SIGKILL ends them too. A process is known by its pid and
its start time, so a pid the system gave to a new process is never killed.
"""

from __future__ import annotations

import os
import signal
import subprocess

Process = tuple[int, str]  # (pid, start time): one process, even after pid reuse


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process (Linux: /proc; else ps)."""
    table: dict[int, tuple[int, str]] = {}
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:  # it has just exited
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            table[int(name)] = (int(fields[1]), fields[19].decode())
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


def descendants(pid: int, table: dict[int, tuple[int, str]] | None = None) -> set:
    """Every live process below ``pid`` (children, their children, ...), as
    (pid, start time) pairs."""
    table = _table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: set[Process] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if (child, table[child][1]) not in found:
                found.add((child, table[child][1]))
                stack.append(child)
    return found


def _alive(process: Process, table: dict[int, tuple[int, str]]) -> bool:
    pid, started = process
    return pid in table and table[pid][1] == started


def _signal(process: Process, signum: int, table: dict[int, tuple[int, str]]) -> None:
    if _alive(process, table):
        try:
            os.kill(process[0], signum)
        except OSError:
            pass


_ROUNDS = 5  # kill_tree: how often to look again for processes forked meanwhile


def kill_tree(root: subprocess.Popen, known: set[Process] = frozenset()) -> None:
    """SIGKILL ``root``, its process group, everything below it, and the ``known``
    processes (noted earlier with ``descendants``) with everything below them; then
    reap ``root``. All are first stopped (SIGSTOP) and looked for again, so that no
    process forked meanwhile escapes."""
    table = _table()
    processes = {process for process in known if _alive(process, table)}
    running = root.returncode is None  # not reaped: its pid is still its own
    if running and root.pid in table:
        processes.add((root.pid, table[root.pid][1]))
    stopped: set[Process] = set()
    for _ in range(_ROUNDS):
        if processes <= stopped:
            break
        for process in processes - stopped:
            _signal(process, signal.SIGSTOP, table)
            stopped.add(process)
        table = _table()
        for process in list(processes):
            if _alive(process, table):  # a pid given to another process: not ours
                processes |= descendants(process[0], table)
    if running and hasattr(os, "killpg"):
        try:  # root leads its own process group (start_new_session)
            os.killpg(root.pid, signal.SIGKILL)
        except OSError:
            pass
    table = _table()
    for process in processes:
        _signal(process, signal.SIGKILL, table)
    if root.poll() is None:
        root.kill()
    root.wait()
