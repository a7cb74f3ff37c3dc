"""Tests for multigpu.exercises.tensor_parallel: 15's checkers pass the reference
operators and loss, and name each mistake learners make."""

import pytest

from multigpu.exercises.tensor_parallel import (
    check_row_parallel,
    check_vocab_parallel_loss,
)
from multigpu.runtime.launch import WorkerNotImportableError
from multigpu.tensor_parallel import (
    CopyToTensorParallel,
    ReduceFromTensorParallel,
    row_parallel_linear,
    vocab_parallel_token_losses,
)
from tests.exercises import wrong_tensor_parallel as wrong

f, g = CopyToTensorParallel, ReduceFromTensorParallel


def test_check_row_parallel_passes_the_reference():
    passed, message = check_row_parallel(f, g, row_parallel_linear)
    assert passed, message
    assert message == (
        "PASS: on 2 ranks the MLP's output and all gradients equal one process: one "
        "all-reduce forward (g), one backward (f)."
    )


@pytest.mark.parametrize(
    ("operators", "expected"),
    [
        (
            (f, wrong.GatherNotReduce, wrong.gather_row_parallel_linear),
            "FAIL: rank 0's output has shape (4, 3, 4), not (2, 3, 4): the ranks' "
            "partial outputs were concatenated (an all-gather?). A row-parallel "
            "linear sums them: g's forward is an all-reduce.",
        ),
        (
            (f, g, wrong.bias_first_row_parallel_linear),
            "FAIL: the output is off by (world size - 1) x bias: every rank added the "
            "bias before the all-reduce, which then summed it 2 times. Add the bias "
            "once, after the all-reduce.",
        ),
        (
            (wrong.CopyNoBackwardReduce, g, row_parallel_linear),
            "FAIL: the output is right, but the input's gradient is only this rank's "
            "part of it: f's backward is missing its all-reduce. Each rank's weight "
            "shard contributes a partial gradient; sum them.",
        ),
        (
            (f, wrong.ReduceBothWays, wrong.both_ways_row_parallel_linear),
            "FAIL: the input's gradient is 2 times too large: g's backward "
            "all-reduces a gradient that is already whole on every rank. g's "
            "backward is the identity (return grad).",
        ),
    ],
    ids=["all-gather", "bias-every-rank", "no-backward-all-reduce", "g-backward"],
)
def test_check_row_parallel_names_the_mistake(operators, expected):
    passed, message = check_row_parallel(*operators)
    assert not passed
    assert message == expected


def test_check_row_parallel_names_a_missing_forward_all_reduce():
    passed, message = check_row_parallel(f, g, wrong.unreduced_row_parallel_linear)
    assert not passed
    assert message.startswith("FAIL: rank 0's output differs from one process by ")
    assert "g's forward must all-reduce it (the sum)" in message


def test_check_row_parallel_refuses_what_the_ranks_cannot_import():
    def row(x, w, b):
        return x

    with pytest.raises(WorkerNotImportableError) as error:
        check_row_parallel(f, g, row)
    assert "cannot be imported by the ranks" in str(error.value)


def test_check_loss_passes_the_reference():
    passed, message = check_vocab_parallel_loss(vocab_parallel_token_losses)
    assert passed, message
    assert message.startswith("PASS: on 2 ranks your loss equals the full")


@pytest.mark.parametrize(
    ("loss", "start"),
    [
        (wrong.unshifted_loss, "FAIL: the loss is not finite for logits around 1000"),
        (wrong.local_max_loss, "FAIL: each rank subtracted its own maximum"),
        (wrong.local_sum_loss, "FAIL: the sum of exponentials is only this rank's"),
        (wrong.local_target_loss, "FAIL: the target's logit is known only to"),
    ],
    ids=["no-max", "local-max", "local-sum", "local-target"],
)
def test_check_loss_names_the_mistake(loss, start):
    passed, message = check_vocab_parallel_loss(loss)
    assert not passed
    assert message.startswith(start), message
