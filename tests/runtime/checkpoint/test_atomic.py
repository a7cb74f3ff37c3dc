"""Atomic saves, and the stale temporaries of killed saves."""

from __future__ import annotations

import errno
import io
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from multigpu.runtime import checkpoint
from multigpu.runtime.checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from tests.runtime.checkpoint.helpers import assert_same_state, small_model

# --- atomic saves -----------------------------------------------------------------


REAL_TORCH_SAVE = torch.save


def interrupted_save(obj, file, *args, **kwargs):
    """Stands in for torch.save: writes half a file, then the user hits Ctrl-C.
    save_checkpoint's own check of the extras (in memory) still works."""
    if isinstance(file, io.BytesIO):
        return REAL_TORCH_SAVE(obj, file, *args, **kwargs)
    file.write(b"PK\x03\x04 half a checkpoint")
    raise KeyboardInterrupt


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    model = small_model(seed=0)
    save_checkpoint(path, model, epoch=1)
    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, small_model(seed=1), epoch=2)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left
    restored = small_model(seed=2)
    assert load_checkpoint(path, restored)["epoch"] == 1
    assert_same_state(model, restored)


def test_a_plain_interrupted_torch_save_destroys_the_old_file(tmp_path):
    """Why the temporary file: writing in place truncates the old checkpoint first."""
    path = tmp_path / "c.pt"
    torch.save(small_model().state_dict(), path)
    with pytest.raises(KeyboardInterrupt), open(path, "wb") as file:
        interrupted_save(None, file)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)


class FailingFile(io.RawIOBase):
    """A file whose writes fail with ``error_number`` after ``good`` bytes, as on a
    disk that fills up (ENOSPC) or is read-only (EROFS)."""

    def __init__(self, file, error_number, good=1000):
        self.file, self.error_number, self.left = file, error_number, good

    def writable(self):
        return True

    def write(self, data):
        if len(data) > self.left:
            raise OSError(self.error_number, os.strerror(self.error_number))
        self.left -= len(data)
        return self.file.write(data)


def failing_save(error_number):
    """A torch.save whose file writes fail with ``error_number``: torch reports it
    as "unexpected pos", with the OSError only in the chained context."""

    def save(obj, file, *args, **kwargs):
        if not isinstance(file, io.BytesIO):
            file = FailingFile(file, error_number)
        return REAL_TORCH_SAVE(obj, file, *args, **kwargs)

    return save


def test_torch_alone_hides_a_full_disk(tmp_path):
    with pytest.raises(RuntimeError, match="unexpected pos") as error:
        with open(tmp_path / "c.pt", "wb") as file:
            failing_save(errno.ENOSPC)(small_model().state_dict(), file)
    assert error.value.__context__.errno == errno.ENOSPC


def test_a_full_disk_says_so_and_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    save_checkpoint(path, small_model(seed=0), epoch=1)
    monkeypatch.setattr(torch, "save", failing_save(errno.ENOSPC))
    with pytest.raises(OSError) as error:
        save_checkpoint(path, small_model(seed=1), epoch=2)
    monkeypatch.undo()
    assert str(error.value) == (
        f"Cannot save {path}: no space left on device. Free some space on that "
        "disk, or save to a folder on another disk."
    )
    assert error.value.errno == errno.ENOSPC
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left
    assert load_checkpoint(path, small_model())["epoch"] == 1  # the old one stays


def test_a_read_only_disk_says_so_even_when_the_cleanup_fails(tmp_path, monkeypatch):
    """On a read-only file system the temporary's removal fails too (EROFS): that
    second error must not hide the first."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    path = tmp_path / "c.pt"
    monkeypatch.setattr(torch, "save", failing_save(errno.EROFS))
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(OSError) as error:
        save_checkpoint(path, small_model(), epoch=1)
    monkeypatch.undo()
    assert str(error.value) == (
        f"Cannot save {path}: the file system is read-only. Save to a folder on a "
        "disk you can write to."
    )
    assert error.value.errno == errno.EROFS


def test_a_read_only_folder_that_must_be_created_says_so(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(Path, "mkdir", read_only)
    path = tmp_path / "new" / "c.pt"
    with pytest.raises(OSError) as error:
        save_checkpoint(path, small_model())
    assert str(error.value) == (
        f"Cannot save {path}: the file system is read-only. Save to a folder on a "
        "disk you can write to."
    )


@pytest.mark.parametrize("depth", [1, 3], ids=["file/c.pt", "file/a/b/c.pt"])
def test_a_path_under_a_regular_file_says_so(tmp_path, depth):
    (tmp_path / "runs").write_text("a file, not a folder")
    path = tmp_path.joinpath("runs", *["a", "b"][: depth - 1], "c.pt")
    for save in (
        lambda: save_checkpoint(path, small_model()),
        lambda: checkpoint.write_atomically(path, {"x": 1}),
    ):
        with pytest.raises(NotADirectoryError) as error:
            save()
        assert str(error.value) == (
            f"Cannot save {path}: {tmp_path / 'runs'} is a file, not a folder. Save "
            "to a path inside a folder, or move that file away."
        )
        assert error.value.errno == errno.ENOTDIR


def test_save_overwrites_atomically(tmp_path):
    path = tmp_path / "c.pt"
    for epoch in range(3):
        save_checkpoint(path, small_model(seed=epoch), epoch=epoch)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert load_checkpoint(path, small_model())["epoch"] == 2


# --- stale temporaries of killed saves --------------------------------------------


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(child.stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    return pid


def temporary(directory: Path, target: str, pid: int, age: float = 0.0) -> Path:
    """A file named like a temporary of a save of ``target`` by process ``pid``,
    last written ``age`` seconds ago."""
    path = directory / f".{target}.{pid}.{os.urandom(4).hex()}.tmp"
    path.write_bytes(b"PK\x03\x04 part of a checkpoint")
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    return path


@pytest.mark.skipif(os.name != "posix", reason="process ids and locks: POSIX only")
def test_the_next_save_removes_stale_temporaries_only(tmp_path):
    import fcntl

    gone, running, ours = dead_pid(), os.getppid(), os.getpid()
    long_ago = checkpoint.STALE_AFTER_SECONDS + 60
    stale = [
        temporary(tmp_path, "c.pt", gone),  # its writer was killed
        temporary(tmp_path, "c.pt", running, age=long_ago),  # an id reused since
        temporary(tmp_path, "c.pt", ours, age=long_ago),  # e.g. a restarted container
    ]
    kept = [
        temporary(tmp_path, "c.pt", running),  # fresh, writer running: may be in flight
        temporary(tmp_path, "c.pt", ours),  # another thread's save, just started
        temporary(tmp_path, "d.pt", gone),  # another target's
        temporary(tmp_path, "c.pt.1", gone),  # another target's, with a similar name
        tmp_path / ".c.pt.notes.tmp",  # not this module's name
        tmp_path / "c.pt.12.0123abcd.tmp",  # not hidden: not this module's
    ]
    for path in kept[-2:]:
        path.write_text("mine")
    locked = temporary(tmp_path, "c.pt", gone, age=long_ago)  # a save in flight
    kept.append(locked)
    with open(locked, "rb") as holder:  # elsewhere, e.g. another container
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1)
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in kept)
    assert load_checkpoint(tmp_path / "c.pt", small_model())["epoch"] == 1


KILLED_SAVE = """
import os, sys, time
import torch
from multigpu.runtime import checkpoint

def stop_before_the_rename(descriptor):  # all bytes written; now hang
    print("written", flush=True)
    time.sleep(300)

os.fsync = stop_before_the_rename
checkpoint.save_checkpoint(sys.argv[1], torch.nn.Linear(100, 100), epoch=0)
"""


@pytest.mark.skipif(os.name != "posix", reason="signals and locks: POSIX only")
@pytest.mark.parametrize(
    "signal_number", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"]
)
def test_a_killed_save_leaves_a_temporary_that_the_next_save_removes(
    tmp_path, signal_number
):
    path = tmp_path / "c.pt"
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([writer.stdout], [], [], 120)
        assert ready and writer.stdout.readline() == "written\n", writer.stderr.read()
        (left,) = [p for p in tmp_path.iterdir() if p.name != "c.pt"]
        assert left.name.startswith(f".c.pt.{writer.pid}.")
        size = left.stat().st_size
        assert size > 100 * 100 * 4  # the whole checkpoint, waiting to be renamed

        save_checkpoint(path, small_model(), epoch=1)  # while the writer is alive
        assert left.exists()  # its save is in flight: kept
        assert load_checkpoint(path, small_model())["epoch"] == 1

        writer.send_signal(signal_number)
        assert writer.wait(timeout=60) == -signal_number
        assert left.exists() and left.stat().st_size == size  # left behind
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
        writer.stderr.close()
    save_checkpoint(path, small_model(), epoch=2)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert load_checkpoint(path, small_model())["epoch"] == 2
