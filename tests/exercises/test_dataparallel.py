"""The checker of notebook 02's exercise 3 (multigpu.exercises.dataparallel): it
passes correct hand-written scatters and names each mistake."""

import pytest
import torch

from multigpu import dataparallel as dp
from multigpu.exercises.dataparallel import check_scatter
from tests.exercises import wrong_dataparallel as wrong


def by_slicing(X, devices):
    """Right: chunks of ceil(B / n) rows, the last one shorter, each moved."""
    size = -(-len(X) // len(devices))
    chunks = []
    for index, start in enumerate(range(0, len(X), size)):
        chunks.append(dp.to_device(X[start : start + size], devices[index]))
    return tuple(chunks)


def by_split(X, devices):
    """Right: torch.split with the chunk size, in a list."""
    size = (len(X) + len(devices) - 1) // len(devices)
    return [
        dp.to_device(chunk, device)
        for chunk, device in zip(torch.split(X, size), devices)
    ]


def by_package(X, devices):
    """Right: the package's own scatter."""
    return dp.scatter(X, devices)


@pytest.mark.parametrize("right", [by_slicing, by_split, by_package])
def test_correct_scatters_pass(right):
    passed, message = check_scatter(right)
    assert passed, message
    assert message.startswith("PASS: your chunks match scatter's for 9 batches")


@pytest.mark.parametrize(
    ("implementation", "expected"),
    [
        (
            wrong.as_shipped,
            "FAIL: for a batch of 12 on 4 device(s) you cut chunks of []; "
            "DataParallel cuts [3, 3, 3, 3]. Your chunks hold 0 rows of the batch's 12",
        ),
        (
            wrong.balanced,
            "FAIL: for a batch of 10 on 4 device(s) you cut chunks of [3, 3, 2, 2]; "
            "DataParallel cuts [3, 3, 3, 1]. Spreading the rows as evenly",
        ),
        (
            wrong.floor_then_rest,
            "FAIL: for a batch of 10 on 4 device(s) you cut chunks of [2, 2, 2, 4]; "
            "DataParallel cuts [3, 3, 3, 1]. Your last chunk is the largest",
        ),
        (
            wrong.empty_chunks,
            "FAIL: for a batch of 5 on 4 device(s) you cut chunks of [2, 2, 1, 0]; "
            "DataParallel cuts [2, 2, 1]. A device with no rows gets no chunk at all",
        ),
        (
            wrong.round_robin,
            "FAIL: for a batch of 12 on 4 device(s) chunk 0 holds rows [0, 4, 8] of "
            "the batch: each chunk is one consecutive block",
        ),
        (
            wrong.not_moved,
            "FAIL: for a batch of 12 on 4 device(s) chunk 0 is on cpu, not on gpu:0",
        ),
        (
            wrong.all_on_the_first,
            "FAIL: for a batch of 12 on 4 device(s) chunk 1 is on gpu:0, not on gpu:1",
        ),
        (
            wrong.detached,
            "FAIL: for a batch of 12 on 4 device(s) your chunks are cut off from the "
            "batch's autograd graph",
        ),
        (
            wrong.a_generator,
            "FAIL: for a batch of 12 on 4 device(s) your function returned a "
            "generator, not a tuple of tensors",
        ),
        (
            wrong.floor_size,
            "FAIL: for a batch of 10 on 4 device(s) your function raised "
            "IndexError: list index out of range",
        ),
    ],
)
def test_each_mistake_is_named(implementation, expected):
    passed, message = check_scatter(implementation)
    assert not passed
    assert message.startswith(expected), message
