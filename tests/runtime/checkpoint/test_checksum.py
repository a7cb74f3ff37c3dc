"""The checksum every save stores and every load checks: flipped bits in a tensor's
bytes are refused, clean files and files without a checksum still load."""

from __future__ import annotations

import random
import warnings
import zipfile

import pytest
import torch
from torch import nn

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


def test_the_checksum_is_a_record_of_the_archive_not_a_key(tmp_path):
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1)
    names = zipfile.ZipFile(tmp_path / "c.pt").namelist()
    folder = next(name for name in names if name.endswith("/data.pkl"))[
        : -len("data.pkl")
    ]
    assert [name for name in names if name.endswith(CHECKSUM_RECORD)] == [
        folder + CHECKSUM_RECORD  # beside torch's own records
    ]
    # torch.load shows the same keys as before (notebook 06 prints them)
    assert list(torch.load(tmp_path / "c.pt", weights_only=True)) == [
        "model",
        "optimizer",
        "epoch",
    ]
    assert verify_checksum(tmp_path / "c.pt") is True


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
