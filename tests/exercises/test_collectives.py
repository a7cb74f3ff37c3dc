"""check_ring_all_reduce (07): the reference passes; each mistake gets its message."""

import pytest

from multigpu import collectives as C
from multigpu.exercises.collectives import check_ring_all_reduce
from tests.exercises import wrong_collectives as wrong


def test_the_reference_ring_passes():
    passed, message = check_ring_all_reduce(C.ring_all_reduce)
    assert passed
    assert message == (
        "PASS: every rank holds the sum and returned the ring's bytes, on 2, 3, 4 "
        "ranks, for 4 cases each."
    )


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (wrong.as_shipped, "FAIL: the tensor is unchanged on 2 ranks: nothing was"),
        (wrong.no_all_gather, "FAIL: each rank holds the sum in one chunk only on 2"),
        (wrong.reduce_to_rank_0, "FAIL: only rank 0 ends with the sum on 2 ranks"),
        (
            wrong.forgets_bytes,
            "FAIL: the sum is right on 2 ranks, but your function returned no bytes",
        ),
        (
            wrong.counts_elements,
            "FAIL: the sum is right on 2 ranks, but you counted elements, not bytes",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_each_mistake_is_named(function, expected):
    passed, message = check_ring_all_reduce(function, world_sizes=(2,))
    assert not passed
    assert message.startswith(expected), message


def test_an_all_reduce_that_is_not_a_ring_is_named_by_its_bytes():
    passed, message = check_ring_all_reduce(C.naive_all_reduce, world_sizes=(3,))
    assert not passed
    assert message == (
        "FAIL: the sum is right on 3 ranks, but the bytes you returned are not the "
        "bytes a ring sends: return the sum of what send_and_receive returned."
    )
