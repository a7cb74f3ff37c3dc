"""One live run per snapshot folder: rank 0 holds a lock on it while it trains (11).

Two runs that snapshot into one folder resume from each other's files. So rank 0 of
a run takes an exclusive ``fcntl.flock`` on ``DIR/run.lock`` before it reads the
snapshot, writes who holds it (its process id, torchrun's, the host, since when),
and keeps the file open until the run ends. The kernel releases the lock when the
process ends, however it ends, so a run killed outright (SIGKILL, the out-of-memory
killer) leaves no stale lock, only its record in the file: the next run takes the
lock over and can say whose it was. Under torchrun's restarts the agent stops every
rank of a round before it starts the next, so each round's rank 0 takes the lock
its predecessor held. Where ``fcntl`` is missing (native Windows) nothing is locked.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multigpu.runtime.checkpoint import CheckpointError
from multigpu.snapshot.events import RESTART_COUNT

try:
    import fcntl
except ImportError:  # native Windows: no flock
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "run.lock"  # in the snapshot folder: who holds it, as JSON
TORCHRUN_RUN_ID = "TORCHELASTIC_RUN_ID"  # set by torchrun in every worker


class SnapshotInUseError(CheckpointError):
    """The snapshot folder is locked by another live run (11)."""


@dataclass
class FolderLock:
    """A snapshot folder's lock, held by this process until :meth:`release` (11).

    ``previous``: the record of an owner that ended without releasing the lock
    (killed), found when it was taken over; None after a clean release."""

    fd: int
    previous: dict[str, Any] | None

    def release(self) -> None:
        """Clear the record and let the lock go (closing the file releases it)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)
            self.fd = -1


def owner_record(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Who this process is, as the lock file records it: its process id, torchrun's
    (its parent, under torchrun) or None, the host, the restart, the time (11)."""
    environ = dict(os.environ) if environ is None else environ
    return {
        "pid": os.getpid(),
        "torchrun_pid": os.getppid() if TORCHRUN_RUN_ID in environ else None,
        "host": socket.gethostname(),
        "restart": int(environ.get(RESTART_COUNT, "0")),
        "since": time.time(),
    }


def describe_owner(owner: dict[str, Any] | None) -> str:
    """The owner of a lock in words, naming its processes (11)."""
    if not owner:
        return "a process that has not recorded itself yet"
    since = time.strftime("%H:%M:%S", time.localtime(owner.get("since", 0)))
    where = f"on host {owner.get('host', '?')}, since {since}"
    torchrun = owner.get("torchrun_pid")
    if torchrun is None:
        return f"process {owner.get('pid', '?')} {where}"
    if _gone(owner, torchrun):  # killed alone: its ranks live on, orphaned
        return (
            f"process {owner.get('pid', '?')} {where}, rank 0 of a torchrun "
            f"(process {torchrun}) that has ended"
        )
    return (
        f"torchrun (process {torchrun}) {where}, whose rank 0 is process "
        f"{owner.get('pid', '?')}"
    )


def same_run(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """True if both records are ranks 0 of one torchrun (one of its restarts)."""
    return (
        bool(a)
        and a.get("torchrun_pid") is not None
        and ((a.get("host"), a.get("torchrun_pid")) == (b["host"], b["torchrun_pid"]))
    )


def lock_folder(folder: str | os.PathLike) -> FolderLock | None:
    """Take the snapshot folder's lock without waiting; None where this system has
    no ``fcntl`` (11). Another live run holding it raises
    :class:`SnapshotInUseError`, which names that run's process."""
    if fcntl is None:
        return None
    fd = os.open(Path(folder) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _read(fd)
        os.close(fd)
        raise SnapshotInUseError(
            f"The snapshot folder {folder} is in use by another run: "
            f"{describe_owner(owner)}. Two runs in one folder would resume from "
            "each other's snapshots. Wait for that run to end, or stop it (kill "
            f"{_to_stop(owner)}), or pass another snapshot folder."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    previous = _read(fd)  # there only if its owner ended without releasing it
    record = json.dumps(owner_record()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    return FolderLock(fd, previous)


def _to_stop(owner: dict[str, Any] | None) -> str:
    """The process to kill to stop the owner's run: its torchrun while it lives."""
    if not owner:
        return "the other run"
    torchrun = owner.get("torchrun_pid")
    if torchrun is not None and not _gone(owner, torchrun):
        return str(torchrun)
    return str(owner.get("pid", "the other run"))


def _gone(owner: dict[str, Any], pid: int) -> bool:
    """True if ``pid`` of the owner's host is known to have ended (this host only)."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, though not ours to signal
        return False
    return False


def _read(fd: int) -> dict[str, Any] | None:
    """The record in the lock file; None if empty or unreadable."""
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
