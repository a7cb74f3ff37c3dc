"""Saving and loading snapshots, in one process (notebook 11)."""

import pytest
import torch

from multigpu import snapshot
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
