"""check_port (12): correct ports pass; each mistake gets its own message."""

import pytest

from multigpu.core.data import get_dataset, tensors
from multigpu.exercises.horovod_api import check_port
from multigpu.runtime import scratch
from tests.exercises import wrong_port

NO_SAMPLER = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from multigpu.core.models import ConvNet


def main(rank, world_size, X, y, epochs=2, batch_size=32, lr=0.1):
    torch.manual_seed(rank)
    model = DDP(ConvNet().double())
    loader = DataLoader(TensorDataset(X, y), batch_size=batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}
"""


@pytest.fixture(scope="module")
def digits():
    X, y = tensors(get_dataset("digits", train=True))
    return X[:128].double(), y[:128]


@pytest.mark.parametrize(
    "main", [wrong_port.right, wrong_port.by_hand_with_broadcast], ids=["DDP", "hand"]
)
def test_correct_ports_pass(digits, main):
    passed, message = check_port(main, *digits)
    assert passed, message
    assert message == (
        "PASS: your DDP port on 2 ranks ends with the weights of the Horovod-style "
        "run (one process on the batch of 64)."
    )


@pytest.mark.parametrize(
    ("main", "expected"),
    [
        (wrong_port.not_wrapped, "FAIL: the ranks end with different weights: each"),
        (wrong_port.wrapper_state_dict, "FAIL: the names start with 'module.'"),
        (
            wrong_port.no_sampler,  # its module names DistributedSampler elsewhere
            "FAIL: the ranks agree, like one process on batches of 32, not 64: each "
            "rank took batch_size divided by the world size, or read every sample",
        ),
        (
            wrong_port.averaged_by_hand_without_broadcast,
            "FAIL: the ranks took the same steps from different weights",
        ),
        (
            wrong_port.lr_scaled,
            "FAIL: the ranks train like one process on the global batch with every "
            "step 2 times too large: the learning rate times the world size (0.2 "
            "instead of 0.1)",
        ),
        (
            wrong_port.summed_by_hand,
            "FAIL: the ranks train like one process on the global batch with every "
            "step 2 times too large",
        ),
        (
            wrong_port.lr_divided,
            "FAIL: the ranks train like one process on the global batch with the "
            "learning rate divided by the world size (0.05 instead of 0.1)",
        ),
        (
            wrong_port.batch_scaled,
            "FAIL: each rank takes batches of 64, the script's batch_size times the "
            "world size, so the ranks together train on batches of 128.",
        ),
        (
            wrong_port.batch_divided,
            "FAIL: the ranks agree, like one process on batches of 32, not 64: each "
            "rank took batch_size divided by the world size",
        ),
        (
            wrong_port.only_rank_0_wraps,
            "FAIL: the ranks waited for each other until the timeout",
        ),
        (
            wrong_port.horovod_left_in,
            "FAIL: your main raised on a rank: ",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_each_mistake_is_named(digits, main, expected):
    passed, message = check_port(main, *digits, timeout=5)
    assert not passed
    assert message.startswith(expected), message
    assert "Traceback" not in message


@pytest.fixture
def learner_modules():
    yield scratch
    scratch.clean_up()


def test_a_port_without_a_sampler_is_named(digits, learner_modules):
    module = learner_modules.write_module("port_without_sampler", NO_SAMPLER)
    passed, message = check_port(module.main, *digits)
    assert not passed
    assert message == (
        "FAIL: every rank trained on every sample (the ranks agree, like one process "
        "on batches of 32): without a DistributedSampler each rank's DataLoader "
        "reads the whole data set, so the ranks repeat each other's work instead of "
        "sharing it."
    )
