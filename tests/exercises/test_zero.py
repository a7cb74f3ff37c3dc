"""Tests for multigpu.exercises.zero: 13's checkers pass the reference ZeRO-2 step
and FSDP2 rank function, and name each mistake learners make."""

import pytest

from multigpu.exercises.zero import check_fsdp2_rank, check_zero2_step
from multigpu.runtime.launch import WorkerNotImportableError
from tests.exercises import wrong_zero
from tests.zero.problem import CONFIG, model_and_data


@pytest.mark.parametrize(
    "step",
    [wrong_zero.padded_zero2_step, wrong_zero.hand_collectives_zero2_step],
    ids=["PyTorch's collectives", "07's ring collectives, padded"],
)
def test_check_step_passes_correct_steps(step):
    model, X, y = model_and_data()
    passed, message = check_zero2_step(step, model, X, y, CONFIG)
    assert passed, message
    assert message == (
        "PASS: on 4 ranks your step trains like one process (weights within 1e-10 "
        "after 4 steps), pads 1,573 parameters to 4 equal chunks, reduce-scatters "
        "the gradient and keeps only its chunk of it."
    )


def test_check_step_passes_on_two_ranks_where_the_chunks_are_nearly_equal():
    model, X, y = model_and_data()
    passed, message = check_zero2_step(
        wrong_zero.padded_zero2_step, model, X, y, CONFIG, world_size=2
    )
    assert passed, message


def test_check_step_refuses_a_step_the_ranks_cannot_import():
    def my_step(model, flat, shard, optimizer, X, y):
        return 0.0

    model, X, y = model_and_data()
    with pytest.raises(WorkerNotImportableError) as error:
        check_zero2_step(my_step, model, X, y, CONFIG)
    assert str(error.value) == (
        "The step 'test_check_step_refuses_a_step_the_ranks_cannot_import.<locals>."
        "my_step' cannot be imported by the ranks. Write it in a module (in a "
        "notebook, a %%module cell), import it from there and pass the imported "
        "function."
    )


@pytest.mark.parametrize(
    ("step", "start", "end"),
    [
        (
            wrong_zero.unpadded_zero2_step,
            "FAIL: a collective refused tensors of unequal sizes: PyTorch's "
            "reduce-scatter and all-gather move world_size equal chunks, and 1,573 "
            "parameters do not divide by 4.",
            "(1576 vs. 1573).)",
        ),
        (
            wrong_zero.untouched_zero2_step,
            "FAIL: after 4 steps no weight has moved: the optimizer never updated "
            "the shard",
            "",
        ),
        (
            wrong_zero.undivided_zero2_step,
            "FAIL: after 4 steps the weights are ",
            "they are what the sum of the ranks' gradients trains. A reduce-scatter "
            "sums; each rank's loss is a mean over its own batch, so the gradient "
            "Adam sees must be the mean over the ranks.",
        ),
        (
            wrong_zero.gather_first_zero2_step,
            "FAIL: after 4 steps the ranks hold different weights: each rank takes "
            "the other ranks' chunks before they are updated.",
            "",
        ),
        (
            wrong_zero.ungathered_zero2_step,
            "FAIL: after 4 steps each rank has moved only its own chunk",
            "That is the all-gather's job, after the optimizer's step.",
        ),
        (
            wrong_zero.gathered_into_a_copy_zero2_step,
            "FAIL: after 4 steps each rank has moved only its own chunk",
            "",
        ),
        (
            wrong_zero.front_padded_zero2_step,
            "FAIL: after 4 steps the ranks agree, but the weights are ",
            "check where the padding goes and which elements of the "
            "reduce-scatter's result are this rank's).",
        ),
        (
            wrong_zero.all_reduce_zero2_step,
            "FAIL: the weights are right, but your step all-reduces: every rank "
            "receives the whole summed gradient",
            "In ZeRO-2 a rank receives only its own chunk of the sum.",
        ),
        (
            wrong_zero.view_of_all_reduced_zero2_step,
            "FAIL: the weights are right, but rank 0's shard.grad keeps 12,608 bytes "
            "of gradient alive instead of at most its chunk's 3,152",
            "",
        ),
        (
            wrong_zero.full_gradient_zero2_step,
            "FAIL: shard.grad got a tensor of another size than the shard",
            "",
        ),
        (
            wrong_zero.one_rank_gathers_zero2_step,
            "FAIL: the ranks waited for each other until the timeout: a collective "
            "ran on some ranks and not on the others.",
            "",
        ),
    ],
    ids=[
        "the TODOs as given",
        "unpadded",
        "undivided",
        "gathered before the step",
        "no all-gather",
        "gathered into a copy",
        "padding in front",
        "all-reduce",
        "a view of the all-reduced gradient",
        "padding in the gradient",
        "only rank 0 gathers",
    ],
)
def test_check_step_names_each_mistake(step, start, end):
    model, X, y = model_and_data()
    passed, message = check_zero2_step(step, model, X, y, CONFIG, timeout=5)
    assert not passed
    assert message.startswith(start), message
    assert message.endswith(end), message
    assert "Traceback" not in message


def test_check_fsdp2_passes_the_solution():
    model, X, y = model_and_data()
    passed, message = check_fsdp2_rank(
        wrong_zero.fsdp2_checkpoint_rank, model, X, y, CONFIG
    )
    assert passed, message
    assert message == (
        "PASS: on 2 ranks your FSDP2 model (every Linear and the whole model sharded "
        "on an explicit CPU mesh) trains like one process (within 1e-10), and the "
        "DCP checkpoint it saved loads back equal."
    )


@pytest.mark.parametrize(
    ("rank_function", "expected"),
    [
        (
            wrong_zero.meshless_fsdp2_rank,
            "FAIL: fully_shard was called without a mesh, so PyTorch picks one "
            "itself: on a machine with a GPU a CUDA mesh, which moves the model to "
            "the GPU even though the ranks use gloo. Every fully_shard call needs "
            "the same explicit CPU mesh of all the ranks (init_device_mesh).",
        ),
        (
            wrong_zero.root_only_fsdp2_rank,
            "FAIL: only the whole model is sharded, as one unit: every forward "
            "all-gathers all of its parameters at once, so the whole model is in "
            "memory together. ZeRO-3 gathers one layer at a time: each Linear must "
            "be a unit of its own, sharded before the whole.",
        ),
        (
            wrong_zero.torch_save_fsdp2_rank,
            "FAIL: the folder holds no DCP checkpoint (no .metadata file). "
            "torch.save on rank 0 writes only rank 0's shard of a sharded model; a "
            "DCP checkpoint is written by every rank together (dcp.save), each its "
            "own rows, with the .metadata file that maps them.",
        ),
        (
            wrong_zero.other_layout_fsdp2_rank,
            "FAIL: dcp.load looked for keys the checkpoint does not have: the "
            "dictionary you load into must have the layout of the one you saved "
            "(the same outer keys), and fresh then takes its part back with "
            "load_state_dict.",
        ),
        (
            wrong_zero.unloaded_fsdp2_rank,
            "away from the weights you saved: the checkpoint never reached it. "
            "dcp.load runs on every rank, after the save, and fills the sharded "
            "state dict of fresh in place.",
        ),
        (
            wrong_zero.unsharded_fsdp2_rank,
            "FAIL: model is not sharded: no fully_shard was applied to it or to any "
            "of its layers, so every rank keeps the whole model (plain data "
            "parallelism, without even the gradient averaging).",
        ),
        (
            wrong_zero.layers_only_fsdp2_rank,
            "FAIL: the layers of model are sharded, but not model itself: without a "
            "root unit nothing starts the all-gathers for the whole forward, and a "
            "parameter outside the layers stays unsharded.",
        ),
    ],
    ids=[
        "no mesh",
        "root only",
        "torch.save on rank 0",
        "other layout",
        "no load",
        "nothing sharded",
        "layers only",
    ],
)
def test_check_fsdp2_names_each_mistake(rank_function, expected):
    model, X, y = model_and_data()
    passed, message = check_fsdp2_rank(rank_function, model, X, y, CONFIG)
    assert not passed
    assert message.endswith(expected)


def test_check_fsdp2_refuses_a_function_the_ranks_cannot_import():
    def my_rank(rank, world_size, model, fresh, X, y, config, checkpoint_dir):
        pass

    model, X, y = model_and_data()
    with pytest.raises(WorkerNotImportableError, match="The rank function "):
        check_fsdp2_rank(my_rank, model, X, y, CONFIG)
