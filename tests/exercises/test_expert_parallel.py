"""Tests for multigpu.exercises.expert_parallel: 18's checker passes the reference
dispatch and combine and a different right answer, and names each mistake learners
make (splits from the wrong rank's view, combining in dispatch order, ...) without
giving the fix. The learner-style answers are in
tests/expert_parallel/learner_answers.py, which the checker's ranks import."""

import multiprocessing
import time

import pytest
import torch

from multigpu.exercises.expert_parallel import (
    EXERCISE_ROUTING,
    check_dispatch_combine,
    exercise_problem,
)
from multigpu.expert_parallel import combine, dispatch
from multigpu.runtime.launch import WorkerNotImportableError
from tests.expert_parallel.learner_answers import (
    dispatch_order_combine,
    no_gradient_combine,
    no_gradient_dispatch,
    own_view_dispatch,
    per_source_counts_dispatch,
    raising_dispatch,
    rank_zero_skips_the_counts,
    right_combine,
    right_dispatch,
    source_order_dispatch,
    unsorted_dispatch,
    unswapped_combine,
)


def test_check_passes_the_reference_and_a_different_right_answer():
    passed, message = check_dispatch_combine(dispatch, combine)
    assert passed, message
    assert message == (
        "PASS: 16 rows (7, 4, 5 on ranks 0-2) reached the ranks of their experts, "
        "came back in order with the experts' outputs, and their gradients came "
        "back too (within 1e-12); rank 1's rows all left it and expert 3 got none."
    )
    passed, message = check_dispatch_combine(right_dispatch, right_combine)
    assert passed, message


def test_the_problem_is_uneven_in_every_way_the_lesson_names():
    problem = exercise_problem()
    assert [len(rows) for rows in problem["rows"]] == [7, 4, 5]
    assert not any(2 <= e < 4 for e in EXERCISE_ROUTING[1])  # rank 1's rows all leave
    assert all(3 not in route for route in EXERCISE_ROUTING)  # expert 3 gets none
    sent = torch.zeros(3, 3, dtype=torch.int64)  # sent[s, r]
    for source, route in enumerate(EXERCISE_ROUTING):
        for expert in route:
            sent[source, expert // 2] += 1
    assert all(not torch.equal(sent[r], sent[:, r]) for r in range(3))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            (own_view_dispatch, right_combine),
            "FAIL: in dispatch, rank 0 expects [4, 0, 3] rows from ranks 0-2, but "
            "they send it [4, 2, 1]: it took its own input split sizes, what it "
            "sends, for what it receives.",
        ),
        (
            (right_dispatch, unswapped_combine),
            "FAIL: in combine, every rank gives all_to_all_single the split sizes of "
            "dispatch in the same places: the outputs would travel on as the rows "
            "did, not back to the ranks they came from.",
        ),
        (
            (right_dispatch, dispatch_order_combine),
            "FAIL: rank 0's outputs come back in the order the rows were sent "
            "(sorted by expert), not in the order of the rows given to dispatch: "
            "combining in dispatch order puts each output on another row.",
        ),
        (
            (source_order_dispatch, right_combine),
            "FAIL: rank 0 received the right rows but hands them to its experts in "
            "the wrong pieces: the received rows come sender by sender, and within "
            "a sender expert by expert; each expert needs its rows from every "
            "sender together.",
        ),
        (
            (unsorted_dispatch, right_combine),
            "FAIL: rank 0's experts got 7 rows, but not the ones routed to them: the "
            "rows do not reach the rank that holds their expert. The rows for one "
            "rank must be consecutive in what a rank sends, in rank order, as many "
            "as its split size says.",
        ),
        (
            (per_source_counts_dispatch, right_combine),
            "FAIL: rank 0 says its experts get [4, 2] rows, but [5, 2] are routed "
            "to them: count the received rows per local expert, from every sending "
            "rank.",
        ),
        (
            (no_gradient_dispatch, no_gradient_combine),
            "FAIL: the outputs are right, but rank 0's rows got no gradient: "
            "autograd cannot follow the rows through the all-to-all you used. The "
            "lesson's all-to-all sends the gradients back.",
        ),
        (
            (raising_dispatch, right_combine),
            "FAIL: your code raised an error on a rank: NameError: name "
            "'received_counts' is not defined",
        ),
    ],
    ids=lambda value: value[0].__name__ if isinstance(value, tuple) else "",
)
def test_check_names_each_mistake(answer, expected):
    passed, message = check_dispatch_combine(*answer)
    assert (passed, message) == (False, expected)


def test_a_rank_that_skips_a_collective_ends_in_the_timeout_with_no_process_left():
    start = time.monotonic()
    passed, message = check_dispatch_combine(
        rank_zero_skips_the_counts, right_combine, timeout=2.0
    )
    assert (passed, message) == (
        False,
        "FAIL: the ranks waited 2 s for each other and gave up: not every rank made "
        "the same collective calls in the same order.",
    )
    assert time.monotonic() - start < 30
    assert multiprocessing.active_children() == []


def test_a_function_the_ranks_cannot_import_is_refused_by_name():
    def local_dispatch(rows, expert_of_row, num_experts, group=None):
        return dispatch(rows, expert_of_row, num_experts, group)

    with pytest.raises(WorkerNotImportableError, match="local_dispatch"):
        check_dispatch_combine(local_dispatch, combine)
