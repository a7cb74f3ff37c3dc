"""Tests for multigpu.exercises.gpt4d: 19's checkers pass the reference and correct
answers written otherwise, and name each mistake learners make; a learner's
exception is a FAIL naming it; an answer that calls the package's own function is
refused by name."""

import pytest

from multigpu.exercises.gpt4d import (
    check_batch_problem,
    check_grid_groups,
    check_sync_dims,
)
from multigpu.gpt4d.config import GPTConfig
from multigpu.gpt4d.grid import DIMS, grid_problem
from tests.exercises.raising import raises


# --- my_groups(grid, dim) -------------------------------------------------------
def groups_by_stride(grid, dim):
    sizes, index = grid.shape, DIMS.index(dim)
    stride = 1
    for size in sizes[index + 1 :]:
        stride *= size
    return [
        [rank + k * stride for k in range(sizes[index])]
        for rank in range(grid.world_size)
        if (rank // stride) % sizes[index] == 0
    ]


def groups_by_coordinates(grid, dim):
    found = {}
    for rank in range(grid.world_size):
        coords = grid.coords(rank)
        found.setdefault(tuple(coords[d] for d in DIMS if d != dim), []).append(rank)
    return list(found.values())


def tp_slowest(grid, dim):  # the dimensions' order reversed: wrong strides
    sizes, order = grid.shape[::-1], DIMS[::-1]
    index, stride = order.index(dim), 1
    for size in sizes[index + 1 :]:
        stride *= size
    return [
        [rank + k * stride for k in range(sizes[index])]
        for rank in range(grid.world_size)
        if (rank // stride) % sizes[index] == 0
    ]


def reversed_groups(grid, dim):
    return [group[::-1] for group in groups_by_stride(grid, dim)]


def one_group_short(grid, dim):
    return groups_by_stride(grid, dim)[:-1]


def calls_the_package(grid, dim):
    return grid.groups(dim)


# --- my_batch_problem(grid, batch, microbatches) ------------------------------------
def batch_problem(grid, batch, microbatches):
    if batch < grid.dp * microbatches:
        return "a replica would get an empty micro-batch"
    return None


def batch_problem_per_replica(grid, batch, microbatches):  # written otherwise
    smallest = batch // grid.dp  # tensor_split's smallest share
    return None if smallest >= microbatches else f"{smallest} < {microbatches}"


def cut_over_every_rank(grid, batch, microbatches):
    return None if batch >= grid.world_size * microbatches else "too small"


def needs_even_cuts(grid, batch, microbatches):
    return None if batch % (grid.dp * microbatches) == 0 else "uneven"


def one_too_strict(grid, batch, microbatches):
    return None if batch > grid.dp * microbatches else "too small"


def cut_over_dp_and_cp(grid, batch, microbatches):
    return None if batch >= grid.dp * grid.cp * microbatches else "too small"


def forgets_microbatches(grid, batch, microbatches):
    return None if batch >= grid.dp else "too small"


def batch_forgets_dp(grid, batch, microbatches):
    return None if batch >= microbatches else "too small"


def returns_an_empty_string(grid, batch, microbatches):
    return batch_problem(grid, batch, microbatches) and ""


def borrowed_problem(grid, batch, microbatches):
    return grid_problem(grid, grid.world_size, GPTConfig(), batch, microbatches)


# --- my_sync_dims(kind) -----------------------------------------------------------
def sync_dims(kind):
    return ["tied", "dp", "cp"] if kind == "embedding" else ["dp", "cp"]


def sync_dims_other_order(kind):
    return ["cp", "dp"] + (["tied"] if kind == "embedding" else [])


def _changed(name, change):
    def answer(kind):
        return change(sync_dims(kind))

    answer.__name__ = name
    return answer


forgets_cp = _changed("forgets_cp", lambda dims: [d for d in dims if d != "cp"])
forgets_dp = _changed("forgets_dp", lambda dims: [d for d in dims if d != "dp"])
forgets_tied = _changed("forgets_tied", lambda dims: [d for d in dims if d != "tied"])
adds_tp = _changed("adds_tp", lambda dims: [*dims, "tp"])
adds_pp = _changed("adds_pp", lambda dims: [*dims, "pp"])


def tp_on_shards_only(kind):
    return [*sync_dims(kind), "tp"] if kind == "column_weight" else sync_dims(kind)


def not_a_group(kind):
    return ["world"]


@pytest.mark.parametrize(
    ("checker", "answer"),
    [
        (check_grid_groups, groups_by_stride),
        (check_grid_groups, groups_by_coordinates),
        (check_batch_problem, batch_problem),
        (check_batch_problem, batch_problem_per_replica),
        (check_sync_dims, sync_dims),
        (check_sync_dims, sync_dims_other_order),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_the_checkers_pass_correct_answers(checker, answer):
    passed, message = checker(answer)
    assert passed, message
    assert message.startswith("PASS")


@pytest.mark.parametrize(
    ("checker", "answer", "words"),
    [
        (
            check_grid_groups,
            tp_slowest,
            "holds ranks that differ in another coordinate",
        ),
        (
            check_grid_groups,
            reversed_groups,
            "is not in the order of its dp coordinate",
        ),
        (check_grid_groups, one_group_short, "do not hold every rank exactly once"),
        (check_grid_groups, calls_the_package, "the package's own groups"),
        (check_batch_problem, cut_over_every_rank, "you refuse a batch of 8"),
        (check_batch_problem, needs_even_cuts, "you refuse an uneven batch of 5"),
        (check_batch_problem, one_too_strict, "you refuse a batch of exactly 4"),
        (check_batch_problem, cut_over_dp_and_cp, "you refuse a batch of 1 sequence"),
        (check_batch_problem, forgets_microbatches, "you accept a batch of 3"),
        (check_batch_problem, batch_forgets_dp, "you accept a batch of 3"),
        (check_batch_problem, returns_an_empty_string, "you accept a batch of 3"),
        (check_batch_problem, borrowed_problem, "the package's own grid_problem"),
        (
            check_sync_dims,
            forgets_cp,
            "misses the tokens of the other context-parallel",
        ),
        (check_sync_dims, forgets_dp, "misses the other data-parallel replicas"),
        (check_sync_dims, forgets_tied, "misses the other copy of the tied weight"),
        (check_sync_dims, adds_tp, "counts one contribution more than once"),
        (check_sync_dims, adds_pp, "counts one contribution more than once"),
        (
            check_sync_dims,
            tp_on_shards_only,
            "adds another tensor-parallel rank's shard",
        ),
        (check_sync_dims, not_a_group, "['world'] is not a group of the grid"),
    ],
    ids=lambda x: getattr(x, "__name__", None) if callable(x) else None,
)
def test_the_checkers_name_each_mistake(checker, answer, words):
    passed, message = checker(answer)
    assert not passed
    assert message.startswith("FAIL")
    assert words in message, message


@pytest.mark.parametrize(
    "checker", [check_grid_groups, check_batch_problem, check_sync_dims]
)
def test_a_learners_exception_is_a_fail_naming_it(checker):
    passed, message = checker(raises)
    assert not passed
    assert "LearnerBug: a learner's mistake" in message


def test_the_batch_cases_agree_with_the_packages_refusal():
    from multigpu.exercises.gpt4d import batch_cases

    for words, grid, batch, microbatches, works in batch_cases():
        found = grid_problem(grid, grid.world_size, GPTConfig(), batch, microbatches)
        assert (found is None) == works, words
