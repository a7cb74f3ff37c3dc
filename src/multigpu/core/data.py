"""Datasets and loaders: the offline digits set by default, MNIST and CIFAR-10 online.

Taught in ``notebooks/01_single_device_baseline.ipynb`` and used by every later one.

- ``"digits"``: 1,797 handwritten digits, 8x8 grey images (UCI optical digits),
  stored in ``data/digits/`` so everything works offline and in seconds.
- ``"mnist"``, ``"cifar10"``: through ``torchvision.datasets``, downloaded into the
  data folder when the machine is online. Offline without a local copy you get an
  error naming the dataset, the folder searched and the command that fetches it::

      python -m multigpu.core.data fetch mnist

The data folder is ``data/`` at the top of the repository, or ``$MULTIGPU_DATA``.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from multigpu.core.checks import check_positive_int

DEFAULT_ROOT = Path(__file__).resolve().parents[3] / "data"
DIGITS_FILE = Path("digits") / "digits.csv.gz"
DIGITS_TRAIN_SIZE = 1437  # the other 360 images are the test split


@dataclass(frozen=True)
class DatasetInfo:
    """Shape facts a model needs: channels, image side, number of classes."""

    in_channels: int
    image_size: int
    num_classes: int
    mean: tuple[float, ...]  # per-channel mean of the training images in [0, 1]
    std: tuple[float, ...]  # per-channel standard deviation, same scale


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(1, 8, 10, (0.3050,), (0.3756,)),
    "mnist": DatasetInfo(1, 28, 10, (0.1307,), (0.3081,)),
    "cifar10": DatasetInfo(
        3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ),
}


class DatasetCorruptError(RuntimeError):
    """A dataset file exists but cannot be read (01)."""


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not on disk and could not be downloaded."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data folder: ``root`` if given, else ``$MULTIGPU_DATA``, else ``data/``."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get("MULTIGPU_DATA", DEFAULT_ROOT))


def dataset_info(name: str) -> DatasetInfo:
    """Channels, image size and classes of a dataset by name (01)."""
    return DATASETS[_check_name(name)]


def default_transform(name: str) -> Callable:
    """Image (PIL or HxW array) -> normalised float tensor (C, H, W) (01)."""
    # torchvision is imported here, not at the top: importing it costs about 1.4 s,
    # which every rank of a launch would pay at start-up without needing it.
    from torchvision.transforms import v2

    info = dataset_info(name)
    return v2.Compose(
        [
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(info.mean), list(info.std)),
        ]
    )


class DigitsDataset(Dataset):
    """The 8x8 UCI digits: items are (image (1, 8, 8) float, label int) (01)."""

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train: bool = True,
        transform: Callable | None = None,
    ) -> None:
        path = data_root(root) / DIGITS_FILE
        if not path.exists():
            raise DatasetNotFoundError(
                f"The digits dataset is missing: {path} does not exist. It ships "
                "with the repository; restore it with `git checkout -- data/digits`."
            )
        try:
            with gzip.open(path, "rt") as f:
                table = np.loadtxt(f, delimiter=",", dtype=np.int64)
        except (OSError, EOFError, ValueError, zlib.error) as error:
            raise DatasetCorruptError(
                f"The digits dataset file {path} is damaged and cannot be read "
                f"({type(error).__name__}: {error}). It ships with the repository; "
                "restore it with `git checkout -- data/digits`."
            ) from error
        # A fixed permutation, independent of any global seed, splits train/test.
        order = torch.randperm(len(table), generator=torch.Generator().manual_seed(0))
        order = order[:DIGITS_TRAIN_SIZE] if train else order[DIGITS_TRAIN_SIZE:]
        table = table[order.numpy()]
        # 0..16 counts -> 0..255 grey levels, (N, 8, 8) uint8, like MNIST's pixels.
        pixels = np.rint(table[:, :64] * (255 / 16)).astype(np.uint8)
        self.images = pixels.reshape(-1, 8, 8)
        self.targets = torch.from_numpy(table[:, 64].copy())
        self.transform = (
            transform if transform is not None else default_transform("digits")
        )
        self.train = train

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[index]), int(self.targets[index])


def get_dataset(
    name: str = "digits",
    train: bool = True,
    root: str | os.PathLike | None = None,
    download: bool = True,
    transform: Callable | None = None,
) -> Dataset:
    """A dataset of (image (C, H, W), label) by name: digits, mnist or cifar10 (01)."""
    name = _check_name(name)
    transform = transform if transform is not None else default_transform(name)
    if name == "digits":
        return DigitsDataset(root, train=train, transform=transform)
    return _torchvision_dataset(name, data_root(root), train, download, transform)


def _torchvision_dataset(
    name: str, root: Path, train: bool, download: bool, transform: Callable
) -> Dataset:
    from torchvision import datasets

    cls = {"mnist": datasets.MNIST, "cifar10": datasets.CIFAR10}[name]
    folder = root / (
        "MNIST" / Path("raw") if name == "mnist" else "cifar-10-batches-py"
    )
    try:
        return cls(str(root), train=train, transform=transform, download=False)
    except RuntimeError as missing:
        if not download:
            raise DatasetNotFoundError(_not_found(name, folder, None)) from missing
    try:
        return cls(str(root), train=train, transform=transform, download=True)
    except (OSError, RuntimeError) as offline:
        raise DatasetNotFoundError(_not_found(name, folder, offline)) from offline


def _not_found(name: str, folder: Path, error: Exception | None) -> str:
    reason = "" if error is None else f" and downloading it failed ({error})"
    return (
        f"Dataset {name!r} is not in {folder}{reason}. Fetch it on a machine that is "
        f"online with `python -m multigpu.core.data fetch {name}`, or use the offline "
        "default 'digits'."
    )


def _check_name(name: str) -> str:
    key = str(name).lower()
    if key not in DATASETS:
        raise ValueError(
            f"Unknown dataset {name!r}. Choose one of {', '.join(sorted(DATASETS))}."
        )
    return key


def epoch_order(length: int, seed: int = 0, epoch: int = 0) -> torch.Tensor:
    """One epoch's shuffled order of ``range(length)``, (length,) int64, seeded
    with ``seed + epoch`` as ``DistributedSampler`` does (01, 08)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(length, generator=generator)


class EpochSampler(torch.utils.data.Sampler[int]):
    """A shuffled order of ``range(length)`` that depends only on ``seed`` and the
    epoch set by :meth:`set_epoch`, like ``DistributedSampler`` on one rank (01)."""

    def __init__(self, length: int, seed: int = 0) -> None:
        self.length, self.seed, self.epoch = length, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration gives."""
        self.epoch = epoch

    def __iter__(self):
        return iter(epoch_order(self.length, self.seed, self.epoch).tolist())

    def __len__(self) -> int:
        return self.length


def make_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """A DataLoader whose batch order depends only on ``seed`` and the epoch (01).

    Shuffled loaders use :class:`EpochSampler`: call ``loader.sampler.set_epoch(e)``
    before epoch ``e`` (``multigpu.core.train.train`` does) for a new order each epoch.
    """
    check_batch_size(batch_size)
    sampler = EpochSampler(len(dataset), seed) if shuffle else None
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last
    )


def check_batch_size(batch_size: int) -> int:
    """Return ``batch_size`` if it is an integer of at least 1, else raise."""
    return check_positive_int(
        "batch_size",
        batch_size,
        "Pass a whole number of samples per step, e.g. batch_size=64.",
    )


def tensors(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole dataset as two tensors: images (N, C, H, W) and labels (N,) (01)."""
    if len(dataset) == 0:
        raise ValueError(
            "tensors got an empty dataset: there is nothing to stack. Pass a dataset "
            "with at least one sample, e.g. get_dataset('digits')."
        )
    images, labels = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(images), torch.tensor(labels)


def main(argv: list[str] | None = None) -> int:
    """``python -m multigpu.core.data fetch NAME``: download a dataset to ``data/``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "fetch":
        print(
            "usage: python -m multigpu.core.data fetch {mnist,cifar10}", file=sys.stderr
        )
        return 2
    for train in (True, False):
        dataset = get_dataset(args[1], train=train, download=True)
        print(f"{args[1]} {'train' if train else 'test'}: {len(dataset)} images")
    print(f"stored under {data_root()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
