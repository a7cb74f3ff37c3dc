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
    "function", [wrong.finishes_its_own_chunk, wrong.counts_received_bytes]
)
def test_a_correct_ring_with_another_schedule_passes(function):
    # Rank r finishing chunk r sends other chunks, so other byte counts per rank
    # than the package's ring, when the chunks are uneven (3 and 4 ranks).
    passed, message = check_ring_all_reduce(function, world_sizes=(3, 4))
    assert passed, message


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


def test_a_ring_that_copies_instead_of_adding_is_named():
    passed, message = check_ring_all_reduce(
        wrong.copies_instead_of_adding, world_sizes=(3,)
    )
    assert not passed
    assert message == (
        "FAIL: no sum on 3 ranks: every chunk ends holding one rank's own values. In "
        "the reduce-scatter the chunk that arrives replaced your copy instead of "
        "being added to it, so the values were passed around, never summed (only "
        "the all-gather overwrites)."
    )


def test_a_deadlock_of_blocking_sends_is_named():
    passed, message = check_ring_all_reduce(
        wrong.blocking_send_then_receive, world_sizes=(2,)
    )
    assert not passed
    assert message.startswith("FAIL on 2 ranks: deadlock. Every rank sent first "), (
        message
    )
    assert "gloo" not in message and "same number of times" not in message


def test_an_all_reduce_that_is_not_a_ring_is_named_by_its_bytes():
    passed, message = check_ring_all_reduce(C.naive_all_reduce, world_sizes=(3,))
    assert not passed
    assert message == (
        "FAIL: the sum is right on 3 ranks, but the bytes you returned are not the "
        "bytes a ring sends: return the sum of what send_and_receive returned."
    )


def test_ring_traffic_is_the_total_of_any_ring_schedule():
    from multigpu.ranks.collectives import is_ring_traffic

    # 10 float32 on 4 ranks: chunks of 3, 3, 2, 2 elements. The package's ring
    # (rank r finishes chunk r + 1) and 13's (rank r finishes chunk r) send
    # different bytes per rank, the same in total: 2(n-1)·S = 240.
    package = [4 * (20 - 3 - 2), 4 * (20 - 2 - 2), 4 * (20 - 2 - 3), 4 * (20 - 3 - 3)]
    own_chunk = [4 * (20 - 3 - 3), 4 * (20 - 3 - 2), 4 * (20 - 2 - 2), 4 * (20 - 2 - 3)]
    assert sum(package) == sum(own_chunk) == 240
    assert is_ring_traffic(package, 10, 4) and is_ring_traffic(own_chunk, 10, 4)
    assert not is_ring_traffic([120, 40, 40, 40], 10, 4)  # naive: rank 0 sends 3·S
    assert not is_ring_traffic([30, 30, 30, 30], 10, 4)  # half of it
    assert not is_ring_traffic([None, 60, 60, 60], 10, 4)  # a rank returned no int
    assert is_ring_traffic([0], 10, 4) and not is_ring_traffic([8], 10, 4)
