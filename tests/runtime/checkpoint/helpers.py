"""Models and file surgery shared by the tests of multigpu.runtime.checkpoint."""

import struct
import zipfile
from pathlib import Path

import torch
from torch import nn

from multigpu.runtime.checkpoint import unwrap


def small_model(seed: int = 0) -> nn.Module:
    """A model with parameters and buffers (BatchNorm), so metadata matters too."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = unwrap(a).state_dict(), unwrap(b).state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0)


class Opaque:
    """An arbitrary class: weights-only loading refuses to unpickle it."""


def tensor_byte_offsets(path: Path) -> list[int]:
    """The offset in ``path`` of every byte of its tensors' data: the records
    ``<archive>/data/<n>`` of torch.save's zip, found from their local headers."""
    offsets = []
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            if info.filename.split("/")[1:2] != ["data"]:
                continue
            file.seek(info.header_offset)
            header = file.read(30)
            assert header[:4] == b"PK\x03\x04"
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            start = info.header_offset + 30 + name_length + extra_length
            offsets.extend(range(start, start + info.compress_size))
    assert offsets, f"{path} holds no tensor data"
    return offsets


def flip_bit(path: Path, offset: int, bit: int) -> None:
    """Flip one bit of the byte at ``offset`` of ``path``, in place."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))
