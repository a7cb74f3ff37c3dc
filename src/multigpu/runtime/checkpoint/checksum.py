"""A checksum stored inside every checkpoint, checked before it is loaded (11).

``torch.save`` writes a zip archive of records (``data.pkl``: the plain data;
``data/0``, ``data/1``, ...: each tensor's bytes) with CRC-32s that ``torch.load``
never checks: a flipped bit in a tensor's bytes loads as a different weight. So a
save adds one more record, ``.data/multigpu_sha256``: the SHA-256 of every other
record, name, length and bytes, in the archive's order. Loading recomputes it first
and refuses a file whose bytes no longer match. Files without the record (written
by ``torch.save`` itself, or by an older version of this package) still load.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zipfile
from pathlib import Path
from typing import IO

from multigpu.runtime.checkpoint.errors import InvalidCheckpointError

CHECKSUM_RECORD = ".data/multigpu_sha256"  # inside the archive's folder
_ALGORITHM = "sha256"
_CHUNK = 1 << 20  # bytes hashed at a time, so a large tensor is never copied whole
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip record's local file header
_SUFFIX = "/" + CHECKSUM_RECORD


def add_checksum(file: IO[bytes]) -> str:
    """Append the checksum record to the archive ``torch.save`` just wrote to the
    open file ``file`` (opened for reading and writing); returns the checksum (11)."""
    file.flush()
    with zipfile.ZipFile(file, "a") as archive:
        digest = _digest(archive, file)
        folder = archive.namelist()[0].partition("/")[0]
        archive.writestr(f"{folder}/{CHECKSUM_RECORD}", f"{_ALGORITHM}:{digest}")
    file.flush()
    return digest


def verify_checksum(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a checksum record that matches its bytes; False if it
    holds none (or is no zip archive, which ``torch.load`` then reports). A checksum
    that does not match raises :class:`InvalidCheckpointError` naming the file (11).
    Errors of opening the file itself (a missing file, a folder) propagate."""
    path = Path(path)
    with open(path, "rb") as file:
        try:
            archive = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError):
            return False  # not an archive zipfile can read: torch.load will say so
        stored_name = next(
            (name for name in archive.namelist() if name.endswith(_SUFFIX)), None
        )
        if stored_name is None:
            return False
        try:
            stored = archive.read(stored_name).decode("ascii")
            actual = f"{_ALGORITHM}:{_digest(archive, file)}"
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, RuntimeError):
            stored, actual = "", "unreadable"  # a record too damaged to read
    if stored != actual:
        raise InvalidCheckpointError(
            f"{path.name} is not a valid checkpoint: its bytes do not match the "
            "checksum saved with it, so it is corrupted (damaged on disk or in a "
            f"copy). Restore {path.name} from a copy, or save the checkpoint again "
            "with save_checkpoint."
        )
    return True


def _digest(archive: zipfile.ZipFile, file: IO[bytes]) -> str:
    """SHA-256 over each record but the checksum: its name, its length, its stored
    bytes read straight from the file (so a wrong CRC-32 is no excuse to stop)."""
    sha = hashlib.sha256()
    for info in archive.infolist():
        if info.filename.endswith(_SUFFIX):
            continue
        file.seek(info.header_offset)
        header = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
        if header[0] != b"PK\x03\x04":
            raise ValueError(f"record {info.filename} has no local header")
        name_length, extra_length = header[-2], header[-1]
        file.seek(name_length + extra_length, os.SEEK_CUR)
        name = info.filename.encode()
        sha.update(struct.pack("<Q", len(name)) + name)
        sha.update(struct.pack("<Q", info.compress_size))
        left = info.compress_size
        while left:
            chunk = file.read(min(left, _CHUNK))
            if not chunk:
                raise EOFError(f"record {info.filename} is cut short")
            sha.update(chunk)
            left -= len(chunk)
    return sha.hexdigest()
