"""Tests for multigpu.exercises.fsdp2: 14b's checkers pass the reference
accumulation step, meta-device build and memory-budget wrap (and other right
answers), and name each mistake learners make."""

import re

import pytest

from multigpu.exercises import fsdp2 as fsdp2_checkers
from multigpu.exercises.fsdp2 import (
    check_accumulation_step,
    check_build_sharded,
    check_wrap_within_budget,
)
from multigpu.runtime.launch import WorkerNotImportableError
from tests.exercises import wrong_fsdp2


def test_check_accumulation_step_passes_the_reference():
    passed, message = check_accumulation_step(wrong_fsdp2.reference_step)
    assert passed, message
    assert message == (
        "PASS: on 2 ranks your step trains like one process on the whole batch "
        "(within 1e-12), with 6 reduce-scatters (3 units x 2 steps, one per unit per "
        "step) and one optimizer step per step."
    )


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (
            wrong_fsdp2.never_synced_step,
            "FAIL: no gradient was ever reduced (0 reduce-scatters): gradient sync "
            "was still off for the last micro-batch, so the sharded gradients stayed "
            "empty and the optimizer had nothing to apply.",
        ),
        (
            wrong_fsdp2.always_synced_step,
            "FAIL: the weights are right, but gradients were reduced after every "
            "micro-batch (3 per step): 18 reduce-scatters instead of 6 (3 units x 2 "
            "steps): gradient sync stayed on for the micro-batches before the last.",
        ),
        (
            wrong_fsdp2.undivided_step,
            "FAIL: the weights moved 3 times too far: they are what the sum of the 3 "
            "micro-batches' mean losses trains, not the mean loss over the whole "
            "batch.",
        ),
        (
            wrong_fsdp2.stepping_every_micro_batch_step,
            "FAIL: the optimizer stepped 6 times in 2 steps (one per micro-batch), so "
            "the weights moved on parts of the batch: accumulation adds the "
            "micro-batches' gradients and steps once on their sum (look at where "
            "optimizer.step() and optimizer.zero_grad() sit).",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_check_accumulation_step_names_each_mistake(step, expected):
    passed, message = check_accumulation_step(step)
    assert not passed
    assert message == expected


def test_check_accumulation_step_refuses_a_step_the_ranks_cannot_import():
    def my_step(model, optimizer, micro_batches):
        return None

    with pytest.raises(WorkerNotImportableError) as error:
        check_accumulation_step(my_step)
    assert str(error.value) == (
        "The step function 'test_check_accumulation_step_refuses_a_step_the_ranks_"
        "cannot_import.<locals>.my_step' cannot be imported by the ranks. Write it in "
        "a module (in a notebook, a %%module cell), import it from there and pass the "
        "imported function."
    )


def test_check_build_sharded_passes_the_reference():
    passed, message = check_build_sharded(wrong_fsdp2.reference_build_sharded)
    assert passed, message
    assert message == (
        "PASS: on 2 ranks the model was built on the meta device, sharded layer by "
        "layer, and each rank allocated 168,976 of its 337,952 bytes and initialised "
        "them with reset_parameters."
    )


@pytest.mark.parametrize(
    ("build_function", "expected"),
    [
        (
            wrong_fsdp2.built_on_cpu_build_sharded,
            "FAIL: build() created the parameters on cpu: every rank allocated the "
            "whole model before sharding it, instead of building it on the meta "
            "device, which records shapes and allocates nothing.",
        ),
        (
            wrong_fsdp2.to_empty_first_build_sharded,
            "FAIL: to_empty ran before fully_shard, so it allocated the whole model on "
            "every rank; after sharding it would allocate only this rank's shards.",
        ),
        (
            wrong_fsdp2.root_only_build_sharded,
            "FAIL: the model is not sharded layer by layer: 3 of 3 Linear layers did "
            "not become FSDP units before anything was allocated.",
        ),
        (
            wrong_fsdp2.never_allocated_build_sharded,
            "FAIL: 6 parameters are still on the meta device (no storage): nothing "
            "allocated this rank's shards after sharding.",
        ),
        (
            wrong_fsdp2.not_reset_build_sharded,
            "FAIL: the shards hold uninitialised memory: to_empty allocates without "
            "filling, and no layer initialised its parameters after it (look at "
            "reset_parameters).",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_check_build_sharded_names_each_mistake(build_function, expected):
    passed, message = check_build_sharded(build_function)
    assert not passed
    assert message == expected


BUDGET_PASS = (
    "PASS: on 4 ranks every rank's peak was at most {peak} bytes, within the budget "
    "of 950,000, and after 2 steps the weights are within 3e-04 of one float32 "
    "process."
)


def test_check_wrap_within_budget_passes_the_reference():
    passed, message = check_wrap_within_budget(wrong_fsdp2.reference_wrap)
    assert passed, message
    assert message == BUDGET_PASS.format(peak="894,976")


@pytest.mark.parametrize(
    ("wrap", "peak"),
    [
        (wrong_fsdp2.checkpoint_wrapper_wrap, "894,976"),
        (wrong_fsdp2.bf16_reductions_wrap, "828,800"),
    ],
    ids=lambda value: getattr(value, "__name__", "peak"),
)
def test_check_wrap_within_budget_passes_other_right_answers(wrap, peak):
    passed, message = check_wrap_within_budget(wrap)
    assert passed, message
    assert message == BUDGET_PASS.format(peak=peak)


@pytest.mark.parametrize(
    ("wrap", "expected"),
    [
        (
            wrong_fsdp2.float32_wrap,
            "FAIL: rank 0's peak was 1,307,436 bytes, over the budget of 950,000. At "
            "the peak it held: temporaries 363,304, parameters all-gathered 276,272, "
            "activations 201,736, parameter shards 201,420, gradient shards 132,352, "
            "gradients before reduce-scatter 132,352. Here the parameters were "
            "all-gathered and computed in float32.",
        ),
        (
            wrong_fsdp2.no_checkpoint_wrap,
            "FAIL: rank 0's peak was 1,107,008 bytes, over the budget of 950,000. At "
            "the peak it held: activations 420,360, parameter shards 201,420, "
            "temporaries 181,652, parameters all-gathered 138,136, gradients before "
            "reduce-scatter 132,352, gradient shards 33,088. Here 6 of 6 blocks saved "
            "their inside for backward instead of recomputing it.",
        ),
        (
            wrong_fsdp2.kept_after_forward_wrap,
            "FAIL: rank 0's peak was 1,043,392 bytes, over the budget of 950,000. At "
            "the peak it held: parameters all-gathered 336,664, parameter shards "
            "201,420, temporaries 181,652, activations 158,216, gradients before "
            "reduce-scatter 132,352, gradient shards 33,088. Here 6 units kept their "
            "all-gathered parameters from forward to backward.",
        ),
        (
            wrong_fsdp2.no_root_wrap,
            "FAIL: the model itself (the root) is not sharded, only 6 units inside it "
            "(6 of 6 blocks): the layers outside them (the first and the last Linear) "
            "stay whole on every rank, and their gradients are never averaged across "
            "the ranks.",
        ),
        (
            wrong_fsdp2.unsharded_wrap,
            "FAIL: nothing was sharded: every rank holds the whole model, its "
            "gradients and its activations, and no gradient is averaged across the "
            "ranks.",
        ),
        (
            wrong_fsdp2.returns_nothing_wrap,
            "FAIL: wrap returned NoneType, not the model: the checker trains what "
            "wrap returns.",
        ),
        (
            wrong_fsdp2.reinitialised_wrap,
            "FAIL: the weights changed inside your wrap, before any training: it must "
            "shard the model it is given, not rebuild or re-initialise it.",
        ),
        (
            wrong_fsdp2.root_first_wrap,
            "FAIL: your wrap, or a training step of the model it returned, raised an "
            "error: TypeError: Invariant encountered: value was None when it should "
            "not be",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_check_wrap_within_budget_names_each_mistake(wrap, expected):
    passed, message = check_wrap_within_budget(wrap)
    assert not passed
    assert message == expected


@pytest.mark.parametrize(
    ("wrap", "pattern"),
    [
        (
            wrong_fsdp2.bf16_master_wrap,
            r"FAIL: the sharded parameters the optimizer updates are bfloat16, not "
            r"float32: bf16 is for computing, and a bf16 master copy loses every "
            r"update smaller than its spacing \(the weights end (\S+) from one float32 "
            r"process\).",
        ),
        (
            wrong_fsdp2.frozen_first_layer_wrap,
            r"FAIL: 2 parameters no longer require gradients: freezing them saves "
            r"their gradients' memory, but they stop training, so the weights end "
            r"(\S+) from one float32 process.",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "pattern"),
)
def test_check_wrap_within_budget_rejects_what_changes_the_results(wrap, pattern):
    passed, message = check_wrap_within_budget(wrap)
    assert not passed
    found = re.fullmatch(pattern, message)
    assert found, message
    assert float(found.group(1)) > fsdp2_checkers.BF16_TOLERANCE


def test_check_wrap_within_budget_names_a_policy_beyond_tolerance(monkeypatch):
    # bf16 reductions stay within 3e-4 here; under a tolerance they exceed, the
    # checker blames the precision policy
    monkeypatch.setattr(fsdp2_checkers, "BF16_TOLERANCE", 1e-6)
    passed, message = check_wrap_within_budget(wrong_fsdp2.bf16_reductions_wrap)
    assert not passed
    assert re.fullmatch(
        r"FAIL: after 2 steps the weights are \S+ from one float32 process, more "
        r"than the 1e-06 that bf16 computation with float32 master weights and "
        r"float32 reductions stays within: the precision policy changes the results "
        r"too much.",
        message,
    ), message


def test_check_wrap_within_budget_refuses_a_wrap_the_ranks_cannot_import():
    def wrap(model, mesh):
        return model

    with pytest.raises(WorkerNotImportableError, match="The wrap function"):
        check_wrap_within_budget(wrap)
