"""Tests for multigpu.exercises.fsdp2: 14b's checkers pass the reference
accumulation step and meta-device build, and name each mistake learners make."""

import pytest

from multigpu.exercises.fsdp2 import check_accumulation_step, check_build_sharded
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
            "FAIL: no gradient was ever reduced (0 reduce-scatters), so the sharded "
            "gradients stayed empty and the optimizer had nothing to apply. Call "
            "model.set_requires_gradient_sync(True) before the last micro-batch's "
            "forward and backward.",
        ),
        (
            wrong_fsdp2.always_synced_step,
            "FAIL: the weights are right, but gradients were reduced after every "
            "micro-batch (3 per step): 18 reduce-scatters instead of 6 (3 units x 2 "
            "steps). Call model.set_requires_gradient_sync(False) before each "
            "micro-batch but the last, and True before the last.",
        ),
        (
            wrong_fsdp2.undivided_step,
            "FAIL: the weights moved 3 times too far: they are what the sum of the 3 "
            "micro-batches' mean losses trains. Divide each micro-batch's loss by the "
            "number of micro-batches (len(micro_batches)) before backward.",
        ),
        (
            wrong_fsdp2.stepping_every_micro_batch_step,
            "FAIL: the optimizer stepped 6 times in 2 steps (one per micro-batch). "
            "Accumulate: call optimizer.step() and optimizer.zero_grad() once, after "
            "the last micro-batch's backward.",
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
            "whole model before sharding it. Call build() inside `with "
            "torch.device('meta'):`, which records shapes and allocates nothing.",
        ),
        (
            wrong_fsdp2.to_empty_first_build_sharded,
            "FAIL: to_empty ran before fully_shard, so it allocated the whole model on "
            "every rank. Shard first, then call model.to_empty(device='cpu'): it then "
            "allocates only this rank's shards.",
        ),
        (
            wrong_fsdp2.not_reset_build_sharded,
            "FAIL: the shards hold uninitialised memory: to_empty allocates without "
            "filling. Call reset_parameters() on every module that has it, after "
            "to_empty.",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_check_build_sharded_names_each_mistake(build_function, expected):
    passed, message = check_build_sharded(build_function)
    assert not passed
    assert message == expected
