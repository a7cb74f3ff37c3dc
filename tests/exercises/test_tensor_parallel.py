"""Tests for multigpu.exercises.tensor_parallel and tensor_parallel_plan: 15's
checkers pass the reference operators, loss and 2-D plan (and right alternatives),
and name each mistake learners make."""

import pytest

import multigpu.exercises.tensor_parallel as checkers
from multigpu.exercises.tensor_parallel import (
    check_row_parallel,
    check_vocab_parallel_loss,
)
from multigpu.exercises.tensor_parallel_plan import check_2d_plan
from multigpu.runtime.launch import WorkerNotImportableError
from multigpu.tensor_parallel import (
    CopyToTensorParallel,
    ReduceFromTensorParallel,
    row_parallel_linear,
    vocab_parallel_token_losses,
)
from multigpu.tensor_parallel.dtensor import parallelize_2d
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
            "partial outputs were concatenated (an all-gather?), but each of them "
            "is a partial sum of the same output features.",
        ),
        (
            (f, g, wrong.bias_first_row_parallel_linear),
            "FAIL: the output is off by (world size - 1) x bias: every rank added the "
            "bias before the all-reduce, which then summed it 2 times.",
        ),
        (
            (wrong.CopyNoBackwardReduce, g, row_parallel_linear),
            "FAIL: the output is right, but the input's gradient is only this rank's "
            "part of it: each rank's weight shard contributes a partial gradient, "
            "and nothing adds them up (look at f's backward).",
        ),
        (
            (f, wrong.ReduceBothWays, wrong.both_ways_row_parallel_linear),
            "FAIL: the input's gradient is 2 times too large: g's backward "
            "all-reduces a gradient that is already whole on every rank.",
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
    assert "every rank must end with the whole sum" in message


def test_check_row_parallel_refuses_what_the_ranks_cannot_import():
    def row(x, w, b):
        return x

    with pytest.raises(WorkerNotImportableError) as error:
        check_row_parallel(f, g, row)
    assert "cannot be imported by the ranks" in str(error.value)


def test_check_loss_passes_the_reference():
    passed, message = check_vocab_parallel_loss(vocab_parallel_token_losses)
    assert passed, message
    assert message == (
        "PASS: on 2 ranks your loss equals the full cross-entropy, for logits around "
        "1000 too, and no rank's collectives moved more than 36 numbers for 6 "
        "tokens (a rank holds 32 logits per token): the logits were never gathered."
    )


@pytest.mark.parametrize(
    ("loss", "start"),
    [
        (
            wrong.unshifted_loss,
            "FAIL: the loss is not finite for logits around 1000: exp overflows",
        ),
        (wrong.local_max_loss, "FAIL: each rank subtracted its own maximum"),
        (
            wrong.local_sum_loss,
            "FAIL: every rank's loss uses only its own slice of the vocabulary: the "
            "normaliser (the sum of exponentials) must cover all ranks.",
        ),
        (wrong.local_target_loss, "FAIL: the loss is right only where this rank"),
    ],
    ids=["no-max", "local-max", "local-sum", "local-target"],
)
def test_check_loss_names_the_mistake(loss, start):
    passed, message = check_vocab_parallel_loss(loss)
    assert not passed
    assert message.startswith(start), message


@pytest.mark.parametrize(
    ("loss", "moved"),
    [(wrong.gathered_logits_loss, 576), (wrong.summed_full_logits_loss, 768)],
    ids=["all-gather", "all-reduce-of-a-full-tensor"],
)
def test_check_loss_refuses_a_loss_that_gathers_the_logits(loss, moved):
    passed, message = check_vocab_parallel_loss(loss)
    assert not passed
    assert message.startswith(
        f"FAIL: rank 0's collectives moved {moved} numbers for 6 tokens, more than "
        "its own 192 logits: the logits were gathered"
    ), message
    assert "without gathering" not in message


@pytest.mark.parametrize(
    "parallelize",
    [parallelize_2d, wrong.per_submodule],
    ids=["reference", "one-call-per-submodule"],
)
def test_check_2d_plan_passes_right_plans(parallelize):
    passed, message = check_2d_plan(parallelize)
    assert passed, message
    assert message.startswith("PASS: on a (dp, tp) = (2, 2) mesh your block's output")


@pytest.mark.parametrize(
    ("parallelize", "expected"),
    [
        (
            wrong.mlp_both_colwise,
            "FAIL: in the MLP every layer is ColwiseParallel: mlp.fc1 is cut by "
            "columns, so each rank holds a slice of the features they produce, and "
            "a column-parallel mlp.fc2 expects all of them.",
        ),
        (
            wrong.everything_colwise,
            "FAIL: in the attention every layer is ColwiseParallel: attn.q, attn.k, "
            "attn.v are cut by columns",
        ),
        (
            wrong.rowwise_first,
            "FAIL: the attention is cut in the wrong order: attn.q, attn.k, attn.v "
            "are RowwiseParallel and attn.out ColwiseParallel.",
        ),
        (
            wrong.mlp_rowwise_first,
            "FAIL: the MLP is cut in the wrong order: mlp.fc1 is RowwiseParallel and "
            "mlp.fc2 ColwiseParallel.",
        ),
        (
            wrong.without_attention_output,
            "FAIL: the plan leaves attn.out whole on every rank.",
        ),
        (
            wrong.tp_over_dp,
            'FAIL: the layers were split over the mesh\'s "dp" dimension.',
        ),
        (
            wrong.whole_mesh,
            "FAIL: parallelize_module was given the whole 2-D mesh",
        ),
        (
            wrong.heads_unchanged,
            "FAIL: the attention still counts 4 heads on each rank",
        ),
        (
            wrong.without_fully_shard,
            'FAIL: nothing shards the block over "dp"',
        ),
        (
            wrong.nothing,
            "FAIL: no linear layer of the block was split",
        ),
    ],
    ids=[
        "mlp-both-colwise",
        "all-colwise",
        "rowwise-first",
        "mlp-rowwise-first",
        "no-attention-output",
        "wrong-mesh-dimension",
        "whole-mesh",
        "heads",
        "no-fully-shard",
        "nothing",
    ],
)
def test_check_2d_plan_names_the_mistake(parallelize, expected):
    passed, message = check_2d_plan(parallelize)
    assert not passed
    assert message.startswith(expected), message


def test_check_loss_turns_an_exception_into_a_fail():
    passed, message = check_vocab_parallel_loss(wrong.raising_loss)
    assert not passed
    assert message.startswith("FAIL: a rank raised IndexError"), message


def test_check_loss_names_a_collective_mismatch():
    passed, message = check_vocab_parallel_loss(wrong.rank_zero_sum_loss)
    assert not passed
    assert message.startswith("FAIL: the ranks' collectives do not match"), message
    assert "pair.cc" not in message  # not gloo's own words


def test_check_loss_names_a_collective_only_one_rank_runs(monkeypatch):
    monkeypatch.setattr(checkers, "TIMEOUT_S", 3.0)
    passed, message = check_vocab_parallel_loss(wrong.rank_zero_extra_all_reduce_loss)
    assert not passed
    assert message == (
        "FAIL: a rank waited in a collective that another rank never ran (that rank "
        "had finished or failed): every collective needs every rank."
    )


def test_check_2d_plan_names_an_exception_in_the_learners_function():
    passed, message = check_2d_plan(wrong.heads_typo)
    assert not passed
    assert message.startswith("FAIL: your function raised TypeError"), message
