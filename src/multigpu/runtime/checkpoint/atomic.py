"""Atomic saves: a temporary file renamed over the target, and the stale
temporaries of saves that were killed (06, 11)."""

from __future__ import annotations

import errno
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from multigpu.runtime.checkpoint.checksum import add_checksum

try:  # POSIX: a save locks its temporary file while it writes it
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# A temporary file nobody holds the lock on is stale once it is this old, whether or
# not a process with its writer's id is running (that id may have been reused).
STALE_AFTER_SECONDS = 10.0


def write_atomically(path: str | os.PathLike, obj: Any) -> None:
    """``torch.save(obj, path)`` through a temporary file and ``os.replace``, so
    ``path`` holds either the old file or the complete new one (06, 11).

    The temporary file is ``.{name}.{pid}.{random}.tmp`` next to ``path``, locked
    (POSIX ``flock``) from its creation until it has replaced ``path``. Before
    writing, the stale temporaries of earlier saves of ``path`` that were killed
    are removed (:func:`remove_stale_temporaries`). The file carries a checksum of
    all its bytes (:func:`add_checksum`), which loading checks. A full disk, a
    read-only file system or a file where a folder should be raises an ``OSError``
    whose one-line message names ``path`` and says so.
    """
    path = Path(path)
    check_folders(path)
    remove_stale_temporaries(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "x+b") as file:
            locked = _lock(file)
            torch.save(obj, file)
            add_checksum(file)
            os.fsync(file.fileno())  # the bytes are on disk before the rename
            if locked:  # rename while still locked: never unlocked before it is done
                os.replace(temporary, path)  # atomic on POSIX and Windows
        if not locked:  # Windows renames no open file
            os.replace(temporary, path)
    except BaseException as error:  # Ctrl-C included: leave no temporary file behind
        try:
            temporary.unlink(missing_ok=True)
        except OSError:  # e.g. a read-only file system: the first error matters
            pass
        if isinstance(error, Exception):
            clear = disk_error(path, error)
            if clear is not None:
                raise clear from error
        raise
    _sync_directory(path.parent)


# errno -> what a full or read-only disk means, and what to do about it
_DISK_ERRORS = {
    errno.ENOSPC: (
        "no space left on device",
        "Free some space on that disk, or save to a folder on another disk.",
    ),
    errno.EDQUOT: (
        "disk quota exceeded",
        "Free some of your space on that disk, or save to a folder on another disk.",
    ),
    errno.EROFS: (
        "the file system is read-only",
        "Save to a folder on a disk you can write to.",
    ),
}


def disk_error(path: Path, error: BaseException) -> OSError | None:
    """A one-line ``OSError`` naming ``path`` if ``error`` or an error it chains
    (torch wraps a failed write in "unexpected pos ...") is a full disk, an
    exceeded quota or a read-only file system; None otherwise (06, 11)."""
    seen: set[int] = set()
    candidate: BaseException | None = error
    while candidate is not None and id(candidate) not in seen:
        seen.add(id(candidate))
        if isinstance(candidate, OSError) and candidate.errno in _DISK_ERRORS:
            what, fix = _DISK_ERRORS[candidate.errno]
            clear = OSError(f"Cannot save {path}: {what}. {fix}")
            clear.errno = candidate.errno  # str() stays the one line above
            return clear
        candidate = candidate.__cause__ or candidate.__context__
    return None


def check_folders(path: Path) -> None:
    """Raise ``NotADirectoryError`` (one line, naming it) if the nearest existing
    folder above ``path`` is in fact a file, where a save cannot create folders."""
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                error = NotADirectoryError(
                    f"Cannot save {path}: {folder} is a file, not a folder. Save "
                    "to a path inside a folder, or move that file away."
                )
                error.errno = errno.ENOTDIR  # str() stays the one line above
                raise error
            return


def _lock(file: Any) -> bool:
    """Lock an open file for as long as it is open; False where there are no locks."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    except OSError:  # a file system without locks
        return False
    return True


def temporary_pattern(path: str | os.PathLike) -> re.Pattern[str]:
    """The names :func:`write_atomically` gives the temporary files of ``path``:
    ``.{name}.{pid}.{8 hex digits}.tmp``; group 1 is the writer's process id (11)."""
    return re.compile(rf"\.{re.escape(Path(path).name)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files left next to ``path`` by saves of ``path`` that
    were killed before they could clean up; returns the files removed (11).

    Only files named like this module's temporaries *of this target* are looked at
    (:func:`temporary_pattern`). A save holds a lock on its temporary file until the
    rename is done, and the operating system drops the lock when the writer dies,
    by any signal; so a locked file is a save in flight and is kept. An unlocked one
    is removed if its writer's process id is not running, or if it was last written
    more than ``STALE_AFTER_SECONDS`` ago (a process id can be reused); a fresh one
    whose writer is running may be a save between creating and locking its file,
    and is kept. On a file system without locks only the process id decides. On
    Windows, where these checks are not available, nothing is removed.
    """
    path = Path(path)
    if os.name != "posix":
        return []
    pattern = temporary_pattern(path)
    try:
        entries = list(os.scandir(path.parent))
    except OSError:  # no folder yet, or not readable: nothing to clean
        return []
    removed = []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and _remove_if_stale(Path(entry.path), int(match.group(1))):
            removed.append(Path(entry.path))
    return removed


def _remove_if_stale(temporary: Path, pid: int) -> bool:
    try:
        file = open(temporary, "rb")
    except OSError:  # gone already, or not ours to read: leave it
        return False
    with file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its writer holds the lock: a save in flight
            return False
        except OSError:  # no locks on this file system: only the process id tells
            stale = not _process_running(pid)
        else:
            age = time.time() - os.fstat(file.fileno()).st_mtime
            stale = age > STALE_AFTER_SECONDS or not _process_running(pid)
        if not stale:
            return False
        try:
            temporary.unlink()
        except OSError:
            return False
    return True


def _process_running(pid: int) -> bool:
    """True if a process with this id exists (POSIX), ours included."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, run by another user
        return True
    except (OverflowError, ValueError):  # no process can have this id
        return False
    return True


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where it is not supported."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
