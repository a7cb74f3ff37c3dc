"""Tests for multigpu.exercises.fsdp: 14's checker passes the reference hooks and
correct alternatives, and names each mistake learners make."""

from multigpu.exercises.fsdp import check_unit_hooks
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
