"""Flip every bit of a checkpoint's zip directory: what does loading do with it?

    python bench/checkpoint_flips.py                  # central directory + end record
    python bench/checkpoint_flips.py --region all     # every bit of the file (slower)
    python bench/checkpoint_flips.py --loader torch   # torch.load alone, for contrast
    python bench/checkpoint_flips.py --checksum record  # as saved before the comment
    python bench/checkpoint_flips.py --checksum none    # as torch.save writes it

A small checkpoint (a model with a BatchNorm, an SGD optimizer with momentum after
one step, an epoch) is saved with ``save_checkpoint``. Each bit of the chosen region
is flipped, one at a time, in a fresh copy of the file, and the copy is loaded into
a fresh model and optimizer with ``load_checkpoint`` (``--loader package``) or with
``torch.load`` and ``load_state_dict`` (``--loader torch``). Each load ends one way:

- refused: the package's ``CheckpointError``, one line naming the file;
- raw: any other exception (or a package error that does not name the file);
- silent: it loads, with no error or warning, and the result differs from the
  clean file's (weights, optimizer state or epoch);
- warned: it loads, differs, and a warning was given;
- same: it loads exactly what the clean file holds (a byte nobody reads).

Every bit of the zip's central directory and end-of-central-directory record (its
comment included), the default regions, must be refused: 0 silent, 0 raw.
Files saved before the checksum comment (``--checksum record``) and ``torch.save``'s
own (``--checksum none``) must give 0 raw and 0 silent: a flip either is refused or
loads the same values (with a warning that a file without a checksum is unchecked).
``tests/runtime/checkpoint/test_checksum.py`` loads a sample of the same flips of
each kind of file (from this file) and asserts the same.
"""

from __future__ import annotations

import argparse
import collections
import struct
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch
from torch import nn

from multigpu.runtime.checkpoint import (
    CHECKSUM_RECORD,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from multigpu.runtime.checkpoint.checksum import _record_digest  # older saves'

REFUSED, RAW, SILENT, WARNED, SAME = "refused", "raw", "silent", "warned", "same"
OUTCOMES = (REFUSED, RAW, SILENT, WARNED, SAME)
_END_RECORD = struct.Struct("<4s4H2LH")  # zip end-of-central-directory record
_END_SIGNATURE = b"PK\x05\x06"


def small_model() -> nn.Module:
    """Parameters and buffers (BatchNorm), so several records and metadata."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def optimizer_for(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def save_small_checkpoint(path: Path, checksum: str = "comment") -> None:
    """The checkpoint the campaign damages: weights, momentum buffers, an epoch.
    ``checksum``: "comment" as ``save_checkpoint`` writes it; "record" as this
    package wrote it before (a checksum record of the records only); "none" as
    ``torch.save`` writes it."""
    model = small_model()
    optimizer = optimizer_for(model)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    save_checkpoint(path, model, optimizer, epoch=3)
    if checksum == "comment":
        return
    comment = zipfile.ZipFile(path).comment  # the checksum
    data = bytearray(path.read_bytes()[: -len(comment)])  # torch.save's bytes
    data[-2:] = b"\0\0"  # the end record announces no comment
    path.write_bytes(bytes(data))
    if checksum == "record":
        with open(path, "r+b") as file, zipfile.ZipFile(file, "a") as archive:
            digest = _record_digest(archive, file)
            folder = archive.namelist()[0].partition("/")[0]
            archive.writestr(f"{folder}/{CHECKSUM_RECORD}", f"sha256:{digest}")


def regions(data: bytes) -> dict[str, range]:
    """The byte offsets of the zip's central directory and of its end record (with
    the archive comment that follows it), from the end record."""
    end = data.rfind(_END_SIGNATURE)
    fields = _END_RECORD.unpack_from(data, end)
    size, offset = fields[5], fields[6]
    return {
        "central directory": range(offset, offset + size),
        "end record": range(end, len(data)),
        "all": range(len(data)),
    }


def load_with_package(path: Path) -> Mapping[str, Any]:
    model = small_model()
    return load_checkpoint(path, model, optimizer_for(model))


def load_with_torch(path: Path) -> Mapping[str, Any]:
    model = small_model()
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(loaded["model"])
    optimizer_for(model).load_state_dict(loaded["optimizer"])
    return loaded


LOADERS: dict[str, Callable[[Path], Mapping[str, Any]]] = {
    "package": load_with_package,
    "torch": load_with_torch,
}


def same(a: Any, b: Any) -> bool:
    """Equal values, tensors compared bit for bit (dtype and shape included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bytes(a), _bytes(b))
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)


def classify(
    path: Path, clean: Mapping[str, Any], load: Callable[[Path], Mapping[str, Any]]
) -> tuple[str, str]:
    """The outcome of loading ``path``, and the error's type (or "")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            loaded = load(path)
        except CheckpointError as error:
            text = str(error)
            named = path.name in text and "\n" not in text
            return (REFUSED if named else RAW), type(error).__name__
        except Exception as error:  # what a learner would see as a traceback
            return RAW, type(error).__name__
    if same(loaded, clean):
        return SAME, ""
    return (WARNED if caught else SILENT), ""


def flips(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Every (offset, bit) of ``offsets``."""
    return [(offset, bit) for offset in offsets for bit in range(8)]


def campaign(
    workdir: Path,
    positions: Iterable[tuple[int, int]],
    load: Callable[[Path], Mapping[str, Any]] = load_with_package,
    clean_file: Path | None = None,
) -> list[tuple[int, int, str, str]]:
    """Load a copy of the clean checkpoint with each (offset, bit) flipped;
    returns (offset, bit, outcome, error type) for each."""
    if clean_file is None:
        clean_file = workdir / "clean.pt"
        save_small_checkpoint(clean_file)
    data = clean_file.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "holds no checksum": counted per flip
        clean = load(clean_file)
    damaged = workdir / "damaged.pt"
    results = []
    for offset, bit in positions:
        flipped = bytearray(data)
        flipped[offset] ^= 1 << bit
        damaged.write_bytes(bytes(flipped))
        results.append((offset, bit, *classify(damaged, clean, load)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--region",
        choices=["directory", "end", "both", "all"],
        default="both",
        help="the bytes to flip: the zip's central directory, its end record (with "
        "the comment), both (the default), or every byte of the file",
    )
    parser.add_argument("--loader", choices=sorted(LOADERS), default="package")
    parser.add_argument(
        "--checksum",
        choices=["comment", "record", "none"],
        default="comment",
        help="the file: as saved now, as saved before the comment, by torch.save",
    )
    options = parser.parse_args(argv)
    load = LOADERS[options.loader]
    print(
        f"torch {torch.__version__}, loader: {options.loader}, "
        f"checksum: {options.checksum}"
    )
    header = (
        f"{'region':<18} {'bytes':>6} {'flips':>6} "
        + " ".join(f"{name:>8}" for name in OUTCOMES)
        + f" {'s':>6}"
    )
    print(header)
    print("-" * len(header))
    names = {
        "directory": ["central directory"],
        "end": ["end record"],
        "both": ["central directory", "end record"],
        "all": ["all"],
    }[options.region]
    bad = 0
    with TemporaryDirectory() as workdir:
        clean_file = Path(workdir) / "clean.pt"
        save_small_checkpoint(clean_file, options.checksum)
        spans = regions(clean_file.read_bytes())
        for name in names:
            start = time.perf_counter()
            results = campaign(Path(workdir), flips(spans[name]), load, clean_file)
            counts = collections.Counter(outcome for _, _, outcome, _ in results)
            seconds = time.perf_counter() - start
            print(
                f"{name:<18} {len(spans[name]):>6} {len(results):>6} "
                + " ".join(f"{counts[outcome]:>8}" for outcome in OUTCOMES)
                + f" {seconds:>6.1f}",
                flush=True,
            )
            errors = collections.Counter(e for _, _, o, e in results if o == RAW)
            if errors:
                print(f"{'':<18} raw errors: {dict(errors.most_common())}")
            bad += counts[SILENT] + counts[RAW]
    expected_clean = options.loader == "package" and options.checksum == "comment"
    return 1 if bad and expected_clean else 0


if __name__ == "__main__":
    sys.exit(main())
