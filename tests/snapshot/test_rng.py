"""Random number generators put back from a snapshot (notebook 11)."""

import random

import numpy as np
import torch

from multigpu import snapshot
from multigpu.core.reproducibility import set_seed
from tests.snapshot.problem import small_sampler, weights_equal


def test_rng_state_survives_a_snapshot_file(tmp_path):
    set_seed(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    path = tmp_path / "snapshot.pt"
    position = snapshot.Position(epoch=1, step=2, global_step=7)
    snapshot.save_snapshot(
        path, model, optimizer, position, small_sampler(), {"x": [1.5]}
    )
    draws = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    loaded, mine = snapshot.load_snapshot(path, fresh, fresh_optimizer, small_sampler())
    assert loaded == position and mine == {"x": [1.5]}
    assert torch.equal(torch.rand(3), draws[0])
    assert np.array_equal(np.random.rand(3), draws[1])
    assert [random.random() for _ in range(3)] == draws[2]
    weights_equal(fresh.state_dict(), model.state_dict())
    momentum = fresh_optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, optimizer.state_dict()["state"][0]["momentum_buffer"])
