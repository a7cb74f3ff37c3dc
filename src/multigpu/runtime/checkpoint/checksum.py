"""A checksum of the whole file stored inside every checkpoint, checked before
torch reads any of it (11).

``torch.save`` writes a zip archive: records (``data.pkl``: the plain data;
``data/0``, ``data/1``, ...: each tensor's bytes), then a central directory (where
each record starts, how it is stored), then an end record (where the directory is).
``torch.load`` checks none of it: a flipped bit in a tensor loads as another weight,
one in the directory can make torch read other bytes as the tensor, or fail with an
error that names no file. So a save ends the archive with a comment (the last field
of the end record, which zip readers, torch's included, skip):
``multigpu-sha256:`` and the SHA-256 of every byte before the comment, the end
record's own fields included. Loading recomputes it before torch parses the file,
and refuses a file whose bytes no longer match it, or whose comment is damaged or no
longer at the end of the file.

Files without the comment still load. Those saved by this package before it carry a
record ``.data/multigpu_sha256``, the SHA-256 of every other record's name, length
and bytes, which is checked as before, with the directory's fields it does not
cover (stored uncompressed, not a folder). Those written by ``torch.save`` itself
load unchecked. A zip directory that cannot be read is refused by name either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import IO

from multigpu.runtime.checkpoint.errors import invalid_checkpoint

CHECKSUM_RECORD = ".data/multigpu_sha256"  # older saves: a record in the archive
_ALGORITHM = "sha256"
_MARKER = b"multigpu-sha256:"  # the comment: this, then the digest in hex
_COMMENT = re.compile(re.escape(_MARKER) + rb"[0-9a-f]{64}")
_COMMENT_SIZE = len(_MARKER) + 64
_END = struct.Struct("<4s4H2LH")  # the zip's end record; its last field: comment size
_END_SIGNATURE = b"PK\x05\x06"
_TAIL = (1 << 16) + _END.size + _COMMENT_SIZE  # how far back a zip reader looks
_CHUNK = 1 << 20  # bytes hashed at a time, so a large file is never read whole
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip record's local file header
_SUFFIX = "/" + CHECKSUM_RECORD
_FOLDER_ATTRIBUTE = 0x10  # MS-DOS "directory" bit of a record's external attributes
CORRUPTED = (
    "its bytes do not match the checksum saved with it, so it is corrupted "
    "(damaged on disk or in a copy)"
)


def add_checksum(file: IO[bytes]) -> str:
    """End the archive ``torch.save`` just wrote to the open file ``file`` (opened
    for reading and writing) with the checksum comment; returns the digest (11)."""
    file.flush()
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - _END.size))
    end = file.read(_END.size)
    if len(end) != _END.size or end[:4] != _END_SIGNATURE or end[-2:] != b"\0\0":
        raise ValueError(
            "add_checksum needs the file torch.save has just written: a zip archive "
            "that ends with its end record and no comment."
        )
    file.seek(size - 2)
    file.write(struct.pack("<H", _COMMENT_SIZE))  # hashed: a flip there is caught
    file.flush()
    digest = _file_digest(file, size)
    file.seek(size)
    file.write(_MARKER + digest.encode("ascii"))
    file.flush()
    return digest


def verify_checksum(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a checksum that matches its bytes; False if it holds
    none (or is no zip archive, which ``torch.load`` then reports). A checksum that
    does not match, a damaged checksum, or a zip directory that cannot be read raises
    :class:`InvalidCheckpointError` naming the file (11). Errors of opening the file
    itself (a missing file, a folder) propagate."""
    path = Path(path)
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(max(0, size - _TAIL))
        tail = file.read()
        comment = tail[-_COMMENT_SIZE:]
        if _COMMENT.fullmatch(comment):
            stored = comment[len(_MARKER) :].decode("ascii")
            if _file_digest(file, size - _COMMENT_SIZE) != stored:
                raise invalid_checkpoint(path, CORRUPTED)
            return True
        if _had_checksum_comment(tail):  # damaged, cut short or followed by bytes
            raise invalid_checkpoint(path, CORRUPTED)
        return _verify_record(path, file)


def _had_checksum_comment(tail: bytes) -> bool:
    """True if the last end record in ``tail`` announces a comment of the size of
    the checksum's: the file had one, which no longer reads as it was written."""
    end = tail.rfind(_END_SIGNATURE)
    if end < 0 or len(tail) - end < _END.size:
        return False
    return _END.unpack_from(tail, end)[-1] == _COMMENT_SIZE


def _file_digest(file: IO[bytes], size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``file``."""
    sha = hashlib.sha256()
    file.seek(0)
    left = size
    while left:
        chunk = file.read(min(left, _CHUNK))
        if not chunk:
            raise EOFError("the file is shorter than its size")
        sha.update(chunk)
        left -= len(chunk)
    return sha.hexdigest()


def _verify_record(path: Path, file: IO[bytes]) -> bool:
    """The check of files saved before the checksum comment: the checksum record,
    and the directory's fields it does not cover. False if there is no record."""
    try:
        archive = zipfile.ZipFile(file)
    except zipfile.BadZipFile:
        return False  # not a zip archive at all: torch.load will say what it is
    except Exception as error:  # UnicodeDecodeError, NotImplementedError, ...
        raise _unreadable(path, error) from error
    stored_name = next(
        (name for name in archive.namelist() if name.endswith(_SUFFIX)), None
    )
    if stored_name is None:
        return False
    try:
        stored = archive.read(stored_name).decode("ascii")
        actual = f"{_ALGORITHM}:{_record_digest(archive, file)}"
    except Exception as error:  # a record too damaged to read
        raise _unreadable(path, error) from error
    if stored != actual:
        raise invalid_checkpoint(path, CORRUPTED)
    return True


def _unreadable(path: Path, error: BaseException) -> Exception:
    return invalid_checkpoint(
        path,
        f"its zip directory cannot be read ({type(error).__name__}), so it is "
        "corrupted (damaged on disk or in a copy)",
    )


def _record_digest(archive: zipfile.ZipFile, file: IO[bytes]) -> str:
    """SHA-256 over each record but the checksum: its name, its length, its stored
    bytes read straight from the file (so a wrong CRC-32 is no excuse to stop). A
    record that torch would not read as stored bytes raises ``ValueError``."""
    sha = hashlib.sha256()
    for info in archive.infolist():
        if info.filename.endswith(_SUFFIX):
            continue
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"record {info.filename} is marked compressed")
        if info.external_attr & _FOLDER_ATTRIBUTE:
            raise ValueError(f"record {info.filename} is marked as a folder")
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
