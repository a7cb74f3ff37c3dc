"""What the tests of notebook 11 share: the problem ``python -m multigpu.snapshot
--float64 --samples N`` trains, built here, and its uninterrupted run's weights.

Models and data are float64, so "equal" means equal to ~1e-12.
"""

import pytest
import torch

from multigpu.core.data import get_dataset, tensors
from multigpu.core.models import ConvNet
from multigpu.core.reproducibility import set_seed
from multigpu.core.train import TrainConfig
from multigpu.ranks.snapshot import snapshot_rank
from multigpu.runtime.launch import spawn
from multigpu.snapshot import ResumableSampler

SAMPLES = 512  # 8 steps of 64 per epoch
EPOCHS = 3  # 24 steps
EVERY = 5  # a snapshot every 5 steps


def weights_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-12)


def script_problem(samples=SAMPLES, epochs=EPOCHS):
    """What ``python -m multigpu.snapshot --float64 --samples N`` trains, built
    here."""
    config = TrainConfig(epochs=epochs)
    set_seed(config.seed)
    model = ConvNet().double()
    X, y = tensors(get_dataset("digits", train=True))
    return model, X[:samples].double(), y[:samples], config


def small_sampler(num_replicas=2, rank=0, seed=0):
    """A sampler of 20 indices, 10 per rank."""
    return ResumableSampler(range(20), num_replicas=num_replicas, rank=rank, seed=seed)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The final weights of an uninterrupted 2-rank run of the same problem."""
    model, X, y, config = script_problem()
    folder = str(tmp_path_factory.mktemp("uninterrupted"))
    histories = spawn(snapshot_rank, 2, model, X, y, config, folder, EVERY, timeout=60)
    return histories[0].parameters
