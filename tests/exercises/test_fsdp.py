"""Tests for multigpu.exercises.fsdp: 14's checkers pass the reference hooks, prefetch
and casts and correct alternatives, and name each mistake learners make."""

from multigpu import fsdp
from multigpu.exercises.fsdp import (
    check_mixed_precision,
    check_prefetch,
    check_unit_hooks,
)
from multigpu.fsdp.hooks import UnitHooks
from tests.exercises import wrong_fsdp


def test_check_unit_hooks_passes_the_reference_and_an_alternative():
    for hooks in (UnitHooks, wrong_fsdp.HooksDividingFirst):
        passed, message = check_unit_hooks(hooks)
        assert passed, message
        assert message.startswith(
            "PASS: on 2 and 3 ranks, in float32 and float64, your hooks train like "
            "one process"
        )
        assert "at most 1 unit gathered at a time" in message
        assert "pre_forward embed; post_forward embed; pre_forward encode+decode" in (
            message
        )


def test_check_unit_hooks_names_each_mistake():
    where = "(unit head, step 1, rank 0 of 2)"
    expected = {
        wrong_fsdp.HooksNeverFreedAfterForward: "FAIL: the unit is still gathered "
        "after its forward (unit embed, step 1, rank 0 of 2): its buffer keeps its "
        "memory until backward",
        wrong_fsdp.HooksNotGatheredForBackward: "FAIL: the unit's backward is about "
        f"to start, but its buffer has no memory {where}: its parameters were freed "
        "after forward and not gathered again.",
        wrong_fsdp.HooksAllocatedNotFilled: "FAIL: after your pre_backward hook the "
        "unit's buffer has its memory back but holds no parameters (the NaN new "
        f"memory holds) {where}",
        wrong_fsdp.HooksFreedBeforeBackwardUsedIt: "FAIL: your pre_backward hook "
        f"gathered the unit, then freed it again {where}: its backward runs right "
        "after the hook returns",
        wrong_fsdp.HooksNeverFreedAfterBackward: "FAIL: the unit is still gathered "
        f"after its backward {where}",
        wrong_fsdp.HooksAllReduce: "FAIL: the gradients are right, but your "
        "post_backward hook all-reduced the whole unit's gradient",
        wrong_fsdp.HooksSumNotMean: "FAIL: the shard's gradient is the sum of the "
        f"ranks' gradients, 2 times their mean {where}",
        wrong_fsdp.HooksOwnGradientOnly: "FAIL: the shard's gradient comes from "
        f"this rank's batch only {where}",
        wrong_fsdp.HooksWholeGradient: "FAIL: your post_backward hook raised "
        "RuntimeError: attempting to assign a gradient of size '[21]' to a tensor "
        "of size '[11]'",
        wrong_fsdp.HooksReducingIntoTheShard: "FAIL: your post_backward hook "
        f"changed the unit's shard {where}.",
        wrong_fsdp.HooksGatherIntoFreedMemory: "FAIL: your pre_forward hook raised "
        "RuntimeError: setStorage",
        wrong_fsdp.HooksGatherOnRankZero: "FAIL: after your pre_forward hook the "
        "unit's buffer has its memory back but holds no parameters (the NaN new "
        "memory holds) (unit embed, step 1, rank 1 of 2)",
    }
    endings = {
        wrong_fsdp.HooksWholeGradient: "the size of its shard.",
        wrong_fsdp.HooksGatherIntoFreedMemory: "only when a hook asks for it "
        "(allocate()).",
    }
    for wrong, start in expected.items():
        passed, message = check_unit_hooks(wrong, timeout=10)
        assert not passed, wrong.__name__
        assert message.startswith(start), (wrong.__name__, message)
        assert message.endswith(endings.get(wrong, "")), (wrong.__name__, message)


def test_check_unit_hooks_reports_ranks_that_wait_for_each_other():
    passed, message = check_unit_hooks(wrong_fsdp.HooksOnlyRankZeroReduces, 3)
    assert not passed
    assert message == (
        "FAIL: in your post_backward hook rank 0 of 2 waited for a collective until "
        "the timeout (unit head, step 1): a collective in your hooks ran on some "
        "ranks only, or in another order on some ranks."
    )


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
        "in order, was not issued (you issued unit 2 instead), so that unit will "
        "wait for its parameters instead of finding them gathered.",
        wrong_fsdp.prefetch_ignoring_depth: "FAIL: with depth=1, before unit 0 "
        "(position 0 of [0, 1, 2, 3, 4]) you issued unit 2's all-gather, which is not "
        "among the next 1 units in order. A prefetch beyond the depth holds one "
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
        "after, so the wire carried float32. Cast before sending and the ring "
        "carries 14 bytes.",
        (wrong_fsdp.gather_without_cast, fsdp.reduce_gradient): "FAIL: "
        "gather_parameters raised ValueError: The input of rank 0 has 7 elements "
        "of torch.float32, but its chunk of 13 elements of torch.bfloat16 over 2 "
        "ranks has 7 of torch.bfloat16. The chunk a rank sends must already have "
        "the dtype of the buffer it lands in (bfloat16): all_gather does not cast.",
        (wrong_fsdp.gather_casting_the_master, fsdp.reduce_gradient): "FAIL: the "
        "master shard changed (its dtype or its values)",
        (fsdp.gather_parameters, wrong_fsdp.reduce_in_bf16): "FAIL: the "
        "reduce-scatter sent 2 bytes per number: you reduced the gradient in "
        "bfloat16, so every addition of the ring rounds to 8 bits of precision",
        (fsdp.gather_parameters, wrong_fsdp.reduce_without_division): "FAIL: "
        "shard_grad is the sum of the ranks' gradients, not their mean",
    }
    for (gather, reduce), start in expected.items():
        passed, message = check_mixed_precision(gather, reduce)
        assert not passed, (gather.__name__, reduce.__name__)
        assert message.startswith(start), message
