"""The checksum every save stores and every load checks: flipped bits anywhere in the
file are refused, clean files and files without a checksum still load."""

from __future__ import annotations

import hashlib
import random
import struct
import warnings
import zipfile

import pytest
import torch
from torch import nn

import bench.checkpoint_flips as flips_bench
from multigpu.runtime.checkpoint import (
    CHECKSUM_RECORD,
    InvalidCheckpointError,
    load_checkpoint,
    same_weights,
    save_checkpoint,
    verify_checksum,
)
from tests.runtime.checkpoint.helpers import (
    assert_same_state,
    flip_bit,
    small_model,
    tensor_byte_offsets,
)

FLIPS = 20  # single-bit flips, each in a fresh copy of the file


def corrupted_message(name: str) -> str:
    return (
        f"{name} is not a valid checkpoint: its bytes do not match the checksum "
        "saved with it, so it is corrupted (damaged on disk or in a copy). Restore "
        f"{name} from a copy, or save the checkpoint again with save_checkpoint."
    )


def flips(path, count=FLIPS, seed=0):
    """``count`` (offset, bit) pairs in the tensor data of ``path``, all different."""
    rng = random.Random(seed)
    offsets = rng.sample(tensor_byte_offsets(path), count)
    return [(offset, rng.randrange(8)) for offset in offsets]


def test_torch_alone_loads_flipped_bits_as_other_weights(tmp_path):
    """What the issue saw: torch.load does not check the records' CRC-32s."""
    source = small_model(seed=0)
    save_checkpoint(tmp_path / "c.pt", source, epoch=1)
    clean = (tmp_path / "c.pt").read_bytes()
    for offset, bit in flips(tmp_path / "c.pt", count=3):
        (tmp_path / "c.pt").write_bytes(clean)
        flip_bit(tmp_path / "c.pt", offset, bit)
        target = small_model(seed=1)
        target.load_state_dict(
            torch.load(tmp_path / "c.pt", weights_only=True)["model"]
        )
        assert not same_weights(source, target)


def test_every_flipped_bit_in_the_tensor_bytes_is_refused(tmp_path):
    source = small_model(seed=0)
    save_checkpoint(tmp_path / "c.pt", source, epoch=1)
    clean = (tmp_path / "c.pt").read_bytes()
    positions = flips(tmp_path / "c.pt")
    assert len(set(positions)) == FLIPS
    for offset, bit in positions:
        (tmp_path / "c.pt").write_bytes(clean)
        flip_bit(tmp_path / "c.pt", offset, bit)
        target = small_model(seed=1)
        with pytest.raises(InvalidCheckpointError) as error:
            load_checkpoint(tmp_path / "c.pt", target)
        assert str(error.value) == corrupted_message("c.pt")
        assert_same_state(target, small_model(seed=1))  # nothing was loaded
    (tmp_path / "c.pt").write_bytes(clean)  # the clean file still loads
    target = small_model(seed=1)
    assert load_checkpoint(tmp_path / "c.pt", target)["epoch"] == 1
    assert_same_state(source, target)


def test_a_flipped_bit_in_the_plain_data_is_refused(tmp_path):
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1, note="a" * 64)
    data = bytearray((tmp_path / "c.pt").read_bytes())
    where = bytes(data).index(b"a" * 64)  # inside data.pkl
    data[where] ^= 1  # "a" -> "`"
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint(tmp_path / "c.pt", small_model())
    assert str(error.value) == corrupted_message("c.pt")


def test_the_checksum_is_the_archive_comment_not_a_key(tmp_path):
    """The SHA-256 of every byte before the zip's comment, in the comment, which
    torch's reader skips: torch.load reads the file as if it were not there."""
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1)
    data = (tmp_path / "c.pt").read_bytes()
    comment = zipfile.ZipFile(tmp_path / "c.pt").comment
    assert comment == b"multigpu-sha256:" + hashlib.sha256(
        data[: -len(comment)]
    ).hexdigest().encode("ascii")
    assert data.endswith(comment)  # nothing after it
    names = zipfile.ZipFile(tmp_path / "c.pt").namelist()
    assert not [name for name in names if name.endswith(CHECKSUM_RECORD)]
    # torch.load shows the same keys as before (notebook 06 prints them)
    assert list(torch.load(tmp_path / "c.pt", weights_only=True)) == [
        "model",
        "optimizer",
        "epoch",
    ]
    assert verify_checksum(tmp_path / "c.pt") is True


# What loading may do with a flipped bit of a file, by the checksum the file holds:
# the comment (saved now) covers every byte; the record (saved before the comment)
# covers each record's bytes, and flips of unused directory fields load unchanged;
# torch.save's own file cannot tell a changed weight (a warning says it is
# unchecked). Never a raw error, never a silent change.
ALLOWED = {
    "comment": {flips_bench.REFUSED},
    "record": {flips_bench.REFUSED, flips_bench.SAME},
    "none": {flips_bench.REFUSED, flips_bench.SAME, flips_bench.WARNED},
}


def entries(data: bytes) -> list[tuple[int, str]]:
    """(offset, name) of each entry of the zip's central directory."""
    found, at = [], flips_bench.regions(data)["central directory"].start
    while data[at : at + 4] == b"PK\x01\x02":
        name, extra, comment = struct.unpack_from("<3H", data, at + 28)
        found.append((at, data[at + 46 : at + 46 + name].decode()))
        at += 46 + name + extra + comment
    return found


def directory_sample(data: bytes, count: int = 32, seed: int = 0) -> list:
    """Every bit of the fixed fields of the central directory entry of the first
    tensor (compression method, attributes, sizes, offset: the fields torch acts
    on), and ``count`` random bits of the rest of the directory and end record."""
    spans = flips_bench.regions(data)
    entry = next(at for at, name in entries(data) if name.endswith("/data/0"))
    fixed = range(entry, entry + 46)
    rest = [
        offset
        for offset in [*spans["central directory"], *spans["end record"]]
        if offset not in fixed
    ]
    rng = random.Random(seed)
    return flips_bench.flips(fixed) + [
        (offset, rng.randrange(8)) for offset in rng.sample(rest, count)
    ]


@pytest.mark.parametrize("checksum", ["comment", "record", "none"])
def test_flips_in_the_zip_directory_are_refused_by_name(tmp_path, checksum):
    """Issue 30: flips in the central directory loaded other weights silently (the
    compression method, the attributes) or raised a raw UnicodeDecodeError,
    struct.error or NotImplementedError; bench/checkpoint_flips.py flips them all."""
    clean = tmp_path / "clean.pt"
    flips_bench.save_small_checkpoint(clean, checksum)
    assert verify_checksum(clean) is (checksum != "none")  # older files still check
    positions = directory_sample(clean.read_bytes())
    assert len(set(positions)) == 46 * 8 + 32
    results = flips_bench.campaign(tmp_path, positions, clean_file=clean)
    wrong = [result for result in results if result[2] not in ALLOWED[checksum]]
    assert not wrong, f"{len(wrong)} of {len(results)}, e.g. {wrong[:5]}"


def test_a_damaged_directory_says_so_in_one_line(tmp_path):
    """A flip that Python's zip reader cannot decode (a name that is no UTF-8) in a
    file saved before the comment: refused by name, never a UnicodeDecodeError."""
    path = tmp_path / "c.pt"
    flips_bench.save_small_checkpoint(path, "record")
    data = bytearray(path.read_bytes())
    entry = entries(data)[0][0]
    assert data[entry + 9] & 0x08  # torch marks every name as UTF-8
    data[entry + 46] ^= 0x80  # the name's first byte ("a") is no UTF-8 now
    path.write_bytes(bytes(data))
    with pytest.raises(UnicodeDecodeError):
        zipfile.ZipFile(path)  # what the check met before
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint(path, small_model())
    assert str(error.value) == (
        "c.pt is not a valid checkpoint: its zip directory cannot be read "
        "(UnicodeDecodeError), so it is corrupted (damaged on disk or in a copy). "
        "Restore c.pt from a copy, or save the checkpoint again with save_checkpoint."
    )


def test_a_damaged_or_moved_checksum_is_refused(tmp_path):
    """The comment itself: a damaged marker, bytes after it, a cut in it."""
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1)
    clean = (tmp_path / "c.pt").read_bytes()
    at = clean.rindex(b"multigpu-sha256:")
    damaged = {
        "marker": clean[:at] + b"multigpu-sha257:" + clean[at + 16 :],
        "digest": clean[:-1] + (b"0" if clean[-1:] != b"0" else b"1"),
        "appended": clean + b"\n",
        "cut": clean[:-10],
    }
    for kind, data in damaged.items():
        (tmp_path / "c.pt").write_bytes(data)
        with pytest.raises(InvalidCheckpointError) as error:
            load_checkpoint(tmp_path / "c.pt", small_model())
        assert str(error.value) == corrupted_message("c.pt"), kind


def test_a_file_without_a_checksum_loads_with_a_note(tmp_path):
    """Decision: a checkpoint dict saved before checksums (or by torch.save) loads,
    with a warning that it is unchecked; a bare state_dict loads silently."""
    source = small_model(seed=0)
    torch.save({"model": source.state_dict(), "epoch": 2}, tmp_path / "old.pt")
    assert verify_checksum(tmp_path / "old.pt") is False
    target = small_model(seed=1)
    with pytest.warns(UserWarning) as caught:
        assert load_checkpoint(tmp_path / "old.pt", target)["epoch"] == 2
    assert [str(warning.message) for warning in caught] == [
        "old.pt holds no checksum (saved by torch.save, or by multigpu before "
        "checkpoints carried one), so damage to its bytes cannot be detected: it is "
        "loaded unchecked. Save it again with save_checkpoint to add a checksum."
    ]
    assert_same_state(source, target)
    torch.save(source.state_dict(), tmp_path / "bare.pt")  # notebook 06's files
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(tmp_path / "bare.pt", small_model(seed=1))


def test_a_large_checkpoint_is_checked_without_error(tmp_path):
    """Records larger than the hashing chunk (1 MiB) are hashed piece by piece."""
    model = nn.Linear(1024, 600)  # 2.4 MB of weights
    save_checkpoint(tmp_path / "big.pt", model)
    assert verify_checksum(tmp_path / "big.pt") is True
    offset = tensor_byte_offsets(tmp_path / "big.pt")[-1]  # the very last byte
    flip_bit(tmp_path / "big.pt", offset, 7)
    with pytest.raises(InvalidCheckpointError, match="do not match the checksum"):
        verify_checksum(tmp_path / "big.pt")
