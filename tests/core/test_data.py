import gzip
import struct
from urllib.error import URLError

import numpy as np
import pytest
import torch

from multigpu.core import data
from multigpu.core.data import (
    DatasetNotFoundError,
    dataset_info,
    get_dataset,
    make_loader,
    tensors,
)


def test_digits_split_is_fixed_disjoint_and_complete():
    train, test = get_dataset("digits"), get_dataset("digits", train=False)
    assert (len(train), len(test)) == (1437, 360)
    X, y = tensors(train)
    assert X.shape == (1437, 1, 8, 8) and X.dtype == torch.float32
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    # The split does not depend on the global seed.
    torch.manual_seed(123)
    again = get_dataset("digits")
    assert np.array_equal(again.images, train.images)
    # Every one of the 1,797 rows lands in exactly one split.
    rows = {
        img.tobytes() + bytes([int(t)]) for img, t in zip(train.images, train.targets)
    }
    rows_test = {
        img.tobytes() + bytes([int(t)]) for img, t in zip(test.images, test.targets)
    }
    assert len(rows | rows_test) >= 1790  # the UCI file has a few duplicate digits


def test_digits_are_normalised_with_the_stated_mean_and_std():
    X, _ = tensors(get_dataset("digits"))
    assert abs(X.mean().item()) < 0.01 and abs(X.std().item() - 1) < 0.02
    raw = get_dataset("digits").images / 255.0
    info = dataset_info("digits")
    assert raw.mean() == pytest.approx(info.mean[0], abs=1e-3)
    assert raw.std() == pytest.approx(info.std[0], abs=1e-3)


def test_digits_pixels_come_from_the_csv_file():
    with gzip.open(data.DEFAULT_ROOT / data.DIGITS_FILE, "rt") as f:
        first = [int(v) for v in f.readline().split(",")]
    dataset = get_dataset("digits", train=True)
    test = get_dataset("digits", train=False)
    images = np.concatenate([dataset.images, test.images]).reshape(-1, 64)
    expected = np.rint(np.array(first[:64]) * 255 / 16).astype(np.uint8)
    assert (images == expected).all(axis=1).any()


def test_unknown_dataset_name_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"Unknown dataset 'imagenet'\. Choose one of "
        r"cifar10, digits, mnist\.",
    ):
        get_dataset("imagenet")


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, None, True])
def test_batch_size_below_one_is_a_clear_error(batch_size):
    with pytest.raises(
        ValueError, match=r"batch_size must be an integer of at least 1"
    ):
        make_loader(get_dataset("digits"), batch_size)


def test_loader_order_depends_only_on_the_seed():
    dataset = get_dataset("digits")
    first = [y.tolist() for _, y in make_loader(dataset, 100, seed=7)]
    torch.manual_seed(999)
    second = [y.tolist() for _, y in make_loader(dataset, 100, seed=7)]
    other = [y.tolist() for _, y in make_loader(dataset, 100, seed=8)]
    assert first == second and first != other


def test_missing_digits_file_says_how_to_restore_it(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"git checkout -- data/digits"):
        get_dataset("digits", root=tmp_path)


# --- torchvision path: a tiny MNIST in the real IDX format, written by the test ---


def write_idx(path, array: np.ndarray) -> None:
    """IDX file: magic (0, 0, dtype 0x08 = uint8, ndim), big-endian dims, data."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_mnist(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("t10k", 5)):
        images = rng.integers(0, 256, size=(count, 28, 28))
        labels = np.arange(count) % 10
        write_idx(raw / f"{split}-images-idx3-ubyte", images)
        write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
    return tmp_path


def test_mnist_loads_through_torchvision_from_idx_files(tiny_mnist):
    train = get_dataset("mnist", root=tiny_mnist, download=False)
    test = get_dataset("mnist", train=False, root=tiny_mnist, download=False)
    assert (len(train), len(test)) == (12, 5)
    image, label = train[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and label == 3
    raw = train.data[3].float() / 255  # what torchvision read from our IDX bytes
    info = dataset_info("mnist")
    torch.testing.assert_close(image[0], (raw - info.mean[0]) / info.std[0])


@pytest.fixture
def offline(monkeypatch):
    """Every download attempt fails as it would without a network."""

    def refuse(*args, **kwargs):
        raise URLError("network is unreachable")

    monkeypatch.setattr("torchvision.datasets.utils.urllib.request.urlopen", refuse)


def test_missing_dataset_offline_names_dataset_folder_and_command(tmp_path, offline):
    with pytest.raises(DatasetNotFoundError) as info:
        get_dataset("mnist", root=tmp_path, download=True)
    message = str(info.value)
    assert "Dataset 'mnist' is not in" in message
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "downloading it failed" in message
    assert "python -m multigpu.core.data fetch mnist" in message


def test_missing_dataset_without_download_does_not_touch_the_network(tmp_path, offline):
    with pytest.raises(
        DatasetNotFoundError,
        match=r"Dataset 'cifar10' is not in .*"
        r"cifar-10-batches-py\. Fetch it .*fetch cifar10",
    ):
        get_dataset("cifar10", root=tmp_path, download=False)


def test_data_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTIGPU_DATA", str(tmp_path))
    assert data.data_root() == tmp_path
    assert data.data_root("elsewhere").name == "elsewhere"


def test_fetch_command_usage(capsys):
    assert data.main([]) == 2
    assert "usage: python -m multigpu.core.data fetch" in capsys.readouterr().err


def test_epoch_sampler_order_depends_only_on_seed_and_epoch():
    dataset = get_dataset("digits")
    loader = make_loader(dataset, 100, seed=3)
    first = [y.tolist() for _, y in loader]
    again = [y.tolist() for _, y in loader]  # same epoch: same order, however often
    loader.sampler.set_epoch(1)
    epoch1 = [y.tolist() for _, y in loader]
    assert first == again and first != epoch1
    assert sorted(loader.sampler) == list(range(len(dataset)))
    fresh = make_loader(dataset, 100, seed=3)
    fresh.sampler.set_epoch(1)
    assert [y.tolist() for _, y in fresh] == epoch1


def test_unshuffled_loader_keeps_dataset_order():
    dataset = get_dataset("digits", train=False)
    labels = torch.cat([y for _, y in make_loader(dataset, 64, shuffle=False)])
    assert torch.equal(labels, dataset.targets)


@pytest.mark.parametrize(
    "content",
    [b"not gzip at all", gzip.compress(b"1,2,3\n")[:-6], gzip.compress(b"1,2,x\n")],
    ids=["not-gzip", "truncated", "not-numbers"],
)
def test_damaged_digits_file_says_how_to_restore_it(tmp_path, content):
    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "digits.csv.gz").write_bytes(content)
    with pytest.raises(data.DatasetCorruptError) as raised:
        get_dataset("digits", root=tmp_path)
    message = str(raised.value)
    assert message.startswith(f"The digits dataset file {tmp_path}")
    assert "is damaged and cannot be read" in message
    assert message.endswith("restore it with `git checkout -- data/digits`.")


def test_tensors_of_an_empty_dataset_is_a_clear_error():
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0))
    with pytest.raises(ValueError) as raised:
        tensors(empty)
    assert str(raised.value) == (
        "tensors got an empty dataset: there is nothing to stack. Pass a dataset "
        "with at least one sample, e.g. get_dataset('digits')."
    )
