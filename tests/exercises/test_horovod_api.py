"""check_port (12): the right port passes; each mistake gets its message."""

import pytest

from multigpu.core.data import get_dataset, tensors
from multigpu.exercises.horovod_api import check_port
from tests.exercises import wrong_port


@pytest.fixture(scope="module")
def digits():
    X, y = tensors(get_dataset("digits", train=True))
    return X[:128].double(), y[:128]


def test_the_right_port_passes(digits):
    passed, message = check_port(wrong_port.right, *digits)
    assert passed
    assert message == (
        "PASS: your DDP port on 2 ranks ends with the weights of the Horovod-style "
        "run (one process on the batch of 64)."
    )


@pytest.mark.parametrize(
    ("main", "expected"),
    [
        (wrong_port.not_wrapped, "FAIL: the ranks end with different weights: each"),
        (wrong_port.wrapper_state_dict, "FAIL: the names start with 'module.'"),
        (wrong_port.no_sampler, "FAIL: every rank trained on every sample"),
        (
            wrong_port.averaged_by_hand_without_broadcast,
            "FAIL: the ranks took the same steps from different weights",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_each_mistake_is_named(digits, main, expected):
    passed, message = check_port(main, *digits)
    assert not passed
    assert message.startswith(expected), message
