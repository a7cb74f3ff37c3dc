"""Tests for multigpu.exercises.fsdp: 14's checkers pass the reference prefetch and
casts, and name each mistake learners make."""

from multigpu import fsdp
from multigpu.exercises.fsdp import check_mixed_precision, check_prefetch
from tests.exercises import wrong_fsdp


def test_check_prefetch_passes_the_reference():
    passed, message = check_prefetch(fsdp.issue_with_prefetch)
    assert passed, message
    assert message.startswith("PASS: before each unit computes")


def test_check_prefetch_names_each_mistake():
    expected = {
        wrong_fsdp.prefetch_waiting_at_once: "FAIL: with depth=1, before unit 0 "
        "(position 0 of [0, 1, 2, 3, 4]) you waited for unit 1's all-gather right "
        "after issuing it, so nothing overlaps",
        wrong_fsdp.prefetch_skipping_a_unit: "FAIL: with depth=1, before unit 0 "
        "(position 0 of [0, 1, 2, 3, 4]) the all-gather of unit 1, one of the next 1 "
        "in order, was not issued (you issued unit 2 instead)",
        wrong_fsdp.prefetch_ignoring_depth: "FAIL: with depth=1, before unit 0 "
        "(position 0 of [0, 1, 2, 3, 4]) you issued unit 2's all-gather, which is not "
        "among the next 1 units in order. A prefetch beyond wrapper.depth holds one "
        "more gathered unit in memory",
        wrong_fsdp.prefetch_without_waiting: "FAIL: with depth=1, before unit 0 "
        "(position 0 of [0, 1, 2, 3, 4]) your function returned without waiting for "
        "unit 0's own all-gather",
        wrong_fsdp.prefetch_before_own: "FAIL: with depth=1, before unit 0 (position "
        "0 of [0, 1, 2, 3, 4]) you issued unit 1's all-gather before unit 0's own.",
    }
    for wrong, start in expected.items():
        passed, message = check_prefetch(wrong)
        assert not passed, wrong.__name__
        assert message.startswith(start), (wrong.__name__, message)


def test_check_prefetch_reports_an_error_of_the_learner():
    def broken(wrapper, order, position):
        wrapper.issue_gather(order[position + wrapper.depth + 10])

    passed, message = check_prefetch(broken)
    assert not passed
    assert message == (
        "FAIL: with depth=1 at position 0 of [0, 1, 2, 3, 4] your function raised "
        "IndexError: list index out of range"
    )


def test_check_mixed_precision_passes_the_reference_and_names_each_mistake():
    passed, message = check_mixed_precision(
        fsdp.gather_parameters, fsdp.reduce_gradient
    )
    assert passed, message
    assert message.startswith("PASS: each rank casts its shard to bfloat16")
    expected = {
        (wrong_fsdp.gather_then_cast, fsdp.reduce_gradient): "FAIL: rank 0 sent 28 "
        "bytes in the all-gather, 4 per number: you gathered in float32 and cast "
        "after. Cast the shard to full.dtype first, then all_gather; that sends 14 "
        "bytes.",
        (wrong_fsdp.gather_without_cast, fsdp.reduce_gradient): "FAIL: "
        "gather_parameters raised ValueError: The input of rank 0 has 7 elements",
        (wrong_fsdp.gather_casting_the_master, fsdp.reduce_gradient): "FAIL: the "
        "master shard changed (its dtype or its values)",
        (fsdp.gather_parameters, wrong_fsdp.reduce_in_bf16): "FAIL: the "
        "reduce-scatter sent 2 bytes per number: you reduced the gradient in "
        "bfloat16",
        (fsdp.gather_parameters, wrong_fsdp.reduce_without_division): "FAIL: "
        "shard_grad is the sum of the ranks' gradients, not their mean",
    }
    for (gather, reduce), start in expected.items():
        passed, message = check_mixed_precision(gather, reduce)
        assert not passed, (gather.__name__, reduce.__name__)
        assert message.startswith(start), message
