"""Tests for multigpu.exercises.context_parallel: 17's checkers pass the reference
and correct answers written otherwise, and name each mistake learners make (the
answers in wrong_context_parallel.py); a learner's exception is a FAIL naming it;
an answer that is or calls the package's own function is refused by name."""

import pytest

from multigpu.context_parallel import (
    causal_block_kind,
    layout_chunks,
    layout_positions,
    merge_partials,
)
from multigpu.exercises.context_parallel import (
    check_block_kind,
    check_merge,
    check_zigzag_positions,
)
from tests.exercises import wrong_context_parallel as wrong
from tests.exercises.raising import raises


@pytest.mark.parametrize(
    ("checker", "answer"),
    [
        (check_merge, wrong.reference_merge),
        (check_merge, wrong.sigmoid_form),
        (check_merge, wrong.logaddexp_form),
        (check_zigzag_positions, wrong.reference_zigzag),
        (check_zigzag_positions, wrong.tail_first),
        (check_zigzag_positions, wrong.as_a_tensor),
        (check_block_kind, wrong.reference_block_kind),
        (check_block_kind, wrong.causal_rule),
        (check_block_kind, wrong.masks_the_past_too),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_the_checkers_pass_correct_answers(checker, answer):
    passed, message = checker(answer)
    assert passed, message
    assert message.startswith("PASS")


def test_the_pass_messages():
    assert check_merge(wrong.reference_merge).message == (
        "PASS: your merge is exact for equal and unequal blocks, finite for "
        "log-sum-exps of +-800, and ring attention with it equals one process within "
        "1e-12 (4 ranks contiguous, 2 ranks zig-zag, causal)."
    )
    assert check_zigzag_positions(wrong.reference_zigzag).message == (
        "PASS: every token on one rank, the same causal work on every rank (16 tokens "
        "on 4 ranks: 34 query-key products needed each), and ring attention on your "
        "layout equals one process within 1e-12."
    )
    assert check_block_kind(wrong.reference_block_kind).message.endswith(
        "(contiguous: ranks skip 3, 2, 1, 0 blocks; zig-zag: 7 each)."
    )


MERGE_MISTAKES = {
    "no_running_max": "FAIL: with log-sum-exps near +800 (scores that large occur) "
    "your merge returns inf or nan",
    "averages_outputs": "FAIL: block a's scores are far larger (log-sum-exp 20 above "
    "b's), so the merge must be almost block a's output; yours is not: merging "
    "normalised outputs without the weight",
    "adds_outputs": "FAIL: two blocks with the same log-sum-exp carry the same "
    "weight, so their merge is the average of their outputs; yours is 2 times it:",
    "unnormalised": "FAIL: two blocks with the same log-sum-exp carry the same "
    "weight, so their merge is the average of their outputs; yours is 2 times it:",
    "swapped_weights": "FAIL: block a's scores are far larger (log-sum-exp 20 above "
    "b's), so the merge must be almost block a's output; yours is almost block b's",
    "max_as_lse": "FAIL: merging two blocks with the same log-sum-exp L must give "
    "L + log 2 (the softmax sum doubles); yours gives L",
    "added_lse": "FAIL: your log-sum-exp is the sum of the two",
    "in_place": "FAIL: your merge changed its inputs in place",
    "keeps_a_trailing_dim": "FAIL: your merge returns shapes (1, 2, 5, 4) and "
    "(1, 2, 5, 1)",
}


@pytest.mark.parametrize("name", list(MERGE_MISTAKES))
def test_check_merge_names_each_mistake(name):
    passed, message = check_merge(getattr(wrong, name))
    assert not passed
    assert message.startswith(MERGE_MISTAKES[name]), message


def test_check_merge_names_the_template_that_returns_one_block():
    passed, message = check_merge(lambda out_a, lse_a, out_b, lse_b: (out_a, lse_a))
    assert (passed, message) == (
        False,
        "FAIL: your merge returns one block's output unchanged: the other block's "
        "keys are missing from the result.",
    )


ZIGZAG_MISTAKES = {
    "contiguous_positions": "FAIL: with 16 tokens on 4 ranks your layout is "
    "contiguous chunks, so the last rank does the most work: under a causal mask "
    "the ranks need [10, 26, 42, 58] query-key products.",
    "tail_off_by_one": "FAIL: with 16 tokens on 4 ranks, rank 0 holds position 16, "
    "outside 0..15: an off-by-one in the tail chunk's index.",
    "halves": "FAIL: with 16 tokens on 4 ranks your layout is not balanced: under a "
    "causal mask the ranks need [22, 30, 38, 46] query-key products.",
    "striped": "FAIL: with 16 tokens on 4 ranks your layout is not balanced: under a "
    "causal mask the ranks need [28, 32, 36, 40] query-key products.",
    "tail_from_the_rank": "FAIL: with 16 tokens on 4 ranks, position 0 is held by "
    "ranks [0, 3]: every token must be on exactly one rank.",
}


@pytest.mark.parametrize("name", list(ZIGZAG_MISTAKES))
def test_check_zigzag_positions_names_each_mistake(name):
    passed, message = check_zigzag_positions(getattr(wrong, name))
    assert not passed
    assert message.startswith(ZIGZAG_MISTAKES[name]), message


BLOCK_MISTAKES = {
    "skips_the_diagonal": "FAIL: your rule skips queries 4-7 against keys 4-7, the "
    "block on the diagonal",
    "diagonal_unmasked": "FAIL: your rule computes queries 4-7 against keys 4-7 "
    "whole: query 4 would then see keys 5-7, its future.",
    "never_skips": "FAIL: your rule computes queries 0-3 against keys 4-7 "
    "('causal'): every key there comes after every query",
    "reversed_direction": "FAIL: your rule skips queries 4-7 against keys 0-3, keys "
    "that come before every query",
    "misspelt": "FAIL: your rule returned 'masked' for queries 4-7 and keys 4-7; "
    "return one of skip, full, causal.",
}


@pytest.mark.parametrize("name", list(BLOCK_MISTAKES))
def test_check_block_kind_names_each_mistake(name):
    passed, message = check_block_kind(getattr(wrong, name))
    assert not passed
    assert message.startswith(BLOCK_MISTAKES[name]), message


def test_check_block_kind_accepts_a_rule_written_with_the_ends_of_the_chunks():
    def by_stop(queries, keys):  # right: two chunks are equal or apart
        if keys.stop > queries.stop:
            return "skip"
        return "causal" if keys.stop == queries.stop else "full"

    passed, message = check_block_kind(by_stop)
    assert passed, message


def test_check_block_kind_names_a_rule_tuned_to_one_chunk_size_in_the_ring():
    passed, message = check_block_kind(wrong.chunks_of_four)
    assert not passed
    assert message.startswith(
        "FAIL: with zig-zag shards on 4 ranks your rule gives attention 2.4e+00 away "
        "from one process and skips [6, 5, 5, 5] blocks per rank"
    ), message


RAISED = {
    "check_merge": "FAIL: your merge raised an error: LearnerBug: a learner's",
    "check_zigzag_positions": "FAIL: your function raised an error for 16 tokens "
    "on 4 ranks, rank 0: LearnerBug: a learner's mistake",
    "check_block_kind": "FAIL: your rule raised an error: LearnerBug",
}


@pytest.mark.parametrize(
    "checker", [check_merge, check_zigzag_positions, check_block_kind], ids=RAISED
)
def test_a_learners_exception_is_a_fail_naming_it(checker):
    passed, message = checker(raises)
    assert not passed
    assert message.startswith(RAISED[checker.__name__]), message


BORROWED = [
    (check_merge, merge_partials, "merge_partials"),
    (check_merge, wrong.calls_the_package_merge, "merge_partials"),
    (check_zigzag_positions, layout_positions, "layout_positions"),
    (check_zigzag_positions, wrong.calls_the_package_layout, "layout_positions"),
    (
        check_zigzag_positions,
        wrong.calls_an_alias_of_the_package_layout,
        "layout_positions",
    ),
    (check_zigzag_positions, wrong.imports_the_package_chunks, "layout_chunks"),
    (check_zigzag_positions, layout_chunks, "layout_chunks"),
    (check_block_kind, causal_block_kind, "causal_block_kind"),
    (check_block_kind, wrong.calls_the_package_rule, "causal_block_kind"),
]


@pytest.mark.parametrize(
    ("checker", "answer", "name"), BORROWED, ids=[a.__name__ for _, a, _ in BORROWED]
)
def test_an_answer_that_hands_the_work_to_the_package_is_refused(checker, answer, name):
    passed, message = checker(answer)
    assert (passed, message) == (
        False,
        f"FAIL: your function hands the work to the package's own {name}, so this "
        "would check the package, not your code.",
    )


def test_a_learners_own_function_named_like_the_packages_is_not_refused():
    def causal_block_kind(queries, keys):  # the learner's own, by that name
        return wrong.reference_block_kind(queries, keys)

    def block_kind(queries, keys):
        return causal_block_kind(queries, keys)

    passed, message = check_block_kind(block_kind)
    assert passed, message
