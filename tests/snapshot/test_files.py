"""Saving and loading snapshots, in one process (notebook 11)."""

import pytest
import torch

from multigpu import snapshot
from multigpu.runtime.checkpoint import InvalidCheckpointError
from tests.runtime.checkpoint.helpers import flip_bit, tensor_byte_offsets
from tests.snapshot.problem import small_sampler


def test_no_snapshot_means_the_start(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    found = snapshot.load_snapshot(
        tmp_path / "none.pt", model, optimizer, small_sampler()
    )
    assert found == (snapshot.Position(), {})


def test_a_snapshot_from_another_world_size_is_refused(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "snapshot.pt"
    snapshot.save_snapshot(path, model, optimizer, snapshot.Position(), small_sampler())
    with pytest.raises(snapshot.SnapshotMismatchError, match="2 as its ranks"):
        snapshot.load_snapshot(path, model, optimizer, small_sampler(num_replicas=4))
    with pytest.raises(snapshot.SnapshotMismatchError, match="same sampler seed"):
        snapshot.load_snapshot(path, model, optimizer, small_sampler(seed=1))


def sampler_of(samples=20, num_replicas=2, seed=0):
    """small_sampler over ``samples`` indices."""
    return snapshot.ResumableSampler(
        range(samples), num_replicas=num_replicas, rank=0, seed=seed
    )


def saved_snapshot(path, global_batch=64, samples=20):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    snapshot.save_snapshot(
        path,
        model,
        optimizer,
        snapshot.Position(0, 3, 3),
        sampler_of(samples=samples),
        global_batch=global_batch,
    )
    return model, optimizer


@pytest.mark.parametrize(
    "setting, sampler_options, load_options, text",
    [
        (
            "global batch",
            {},
            {"global_batch": 32},
            "64 as its global batch, and this run has 32",
        ),
        (
            "samples",
            {"samples": 40},
            {"global_batch": 64},
            "20 as its number of samples, and this run has 40",
        ),
        (
            "ranks",
            {"num_replicas": 4},
            {"global_batch": 64},
            "2 as its ranks, and this run has 4",
        ),
        (
            "seed",
            {"seed": 1},
            {"global_batch": 64},
            "0 as its sampler seed, and this run has 1",
        ),
    ],
)
def test_every_setting_that_moves_the_samples_is_refused(
    tmp_path, setting, sampler_options, load_options, text
):
    path = tmp_path / "snapshot.pt"
    model, optimizer = saved_snapshot(path)
    meaning = text.split(" as its ")[1].split(",")[0]
    with pytest.raises(snapshot.SnapshotMismatchError) as error:
        snapshot.load_snapshot(
            path, model, optimizer, sampler_of(**sampler_options), **load_options
        )
    assert str(error.value) == (
        f"snapshot.pt was written by a run with {text}, so its sample order would "
        f"not continue this one. Resume with the same {meaning}, or start afresh in "
        "a new snapshot folder."
    )


def test_the_same_settings_resume(tmp_path):
    path = tmp_path / "snapshot.pt"
    model, optimizer = saved_snapshot(path)
    position, mine = snapshot.load_snapshot(
        path, model, optimizer, sampler_of(), global_batch=64
    )
    assert position == snapshot.Position(0, 3, 3)
    assert mine == {}


def test_a_corrupted_snapshot_is_refused(tmp_path):
    path = tmp_path / "snapshot.pt"
    model, optimizer = saved_snapshot(path)
    flip_bit(path, tensor_byte_offsets(path)[0], 0)
    with pytest.raises(InvalidCheckpointError, match="^snapshot.pt is not a valid"):
        snapshot.load_snapshot(path, model, optimizer, sampler_of())


@pytest.mark.parametrize(
    "options, text",
    [
        ({"lr": 0.5}, "0.1 as its optimizer's lr, and this run has 0.5"),
        (
            {"lr": 0.1, "momentum": 0.9},
            "0 as its optimizer's momentum, and this run has 0.9",
        ),
    ],
)
def test_another_lr_or_momentum_is_refused_by_name(tmp_path, options, text):
    """load_state_dict would silently put back the saved lr and momentum."""
    path = tmp_path / "snapshot.pt"
    model, _ = saved_snapshot(path)  # saved with SGD(lr=0.1), no momentum
    optimizer = torch.optim.SGD(model.parameters(), **options)
    with pytest.raises(snapshot.SnapshotMismatchError) as error:
        snapshot.load_snapshot(path, model, optimizer, sampler_of(), global_batch=64)
    assert text in str(error.value)
    assert str(error.value).endswith("or start afresh in a new snapshot folder.")
