"""Tests for multigpu.exercises.zero: 13's checkers pass the reference ZeRO-2 step
and FSDP2 rank function, and name each mistake learners make."""

import inspect

import pytest

from multigpu import zero
from multigpu.exercises.zero import check_fsdp2_rank, check_zero2_step
from multigpu.runtime import scratch
from multigpu.runtime.launch import WorkerNotImportableError
from tests.exercises import wrong_zero
from tests.zero.problem import CONFIG, model_and_data


@pytest.fixture
def learner_modules():
    yield scratch
    scratch.clean_up()


def test_check_step_passes_the_reference_step():
    model, X, y = model_and_data()
    passed, message = check_zero2_step(zero.zero2_step, model, X, y, CONFIG)
    assert passed, message
    assert message.startswith("PASS: on 2 ranks your step trains like one process")


def test_check_step_names_the_missing_division(learner_modules):
    source = inspect.getsource(zero.zero2_step).replace(
        "    shard.grad /= dist.get_world_size()\n", ""
    )
    header = (
        "import torch\nimport torch.distributed as dist\n"
        "from torch.nn import functional as F\n"
        "from multigpu.collectives import all_gather, reduce_scatter\n"
        "from multigpu.zero import pop_flat_gradients\n\n"
    )
    module = learner_modules.write_module("undivided_zero2", header + source)
    model, X, y = model_and_data()
    passed, message = check_zero2_step(module.zero2_step, model, X, y, CONFIG)
    assert not passed
    assert message.startswith("FAIL: after 4 steps the weights are ")
    assert "what the sum of the ranks' gradients trains" in message
    assert "divide shard.grad by the world size" in message


def test_check_step_names_the_all_reduce_that_zero1_sends():
    model, X, y = model_and_data()
    passed, message = check_zero2_step(zero.zero1_step, model, X, y, CONFIG)
    assert not passed
    assert message.startswith("FAIL: the weights are right, but rank 0 reported")
    assert "one reduce-scatter and one all-gather" in message


def test_check_step_refuses_a_step_the_ranks_cannot_import():
    def my_step(model, flat, shard, optimizer, X, y):
        return 0.0, 0

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
    ("step", "expected"),
    [
        (
            wrong_zero.undivided_zero2_step,
            "they are what the sum of the ranks' gradients trains. reduce_scatter "
            "sums; divide shard.grad by the world size to get the mean.",
        ),
        (
            wrong_zero.gather_first_zero2_step,
            "FAIL: after 4 steps the ranks hold different weights: each rank takes "
            "the other ranks' chunks before they are updated. All-gather after "
            "optimizer.step(), not before it.",
        ),
        (
            wrong_zero.ungathered_zero2_step,
            "FAIL: after 4 steps each rank has moved only its own chunk: the other "
            "ranks' chunks never reach it. After optimizer.step(), all-gather the "
            "updated chunks into flat: sent += all_gather(flat, shard.detach()).",
        ),
    ],
    ids=["undivided", "gathered before the step", "no all-gather"],
)
def test_check_step_names_each_mistake(step, expected):
    model, X, y = model_and_data()
    passed, message = check_zero2_step(step, model, X, y, CONFIG)
    assert not passed
    assert message.endswith(expected)


def test_check_step_names_the_error_of_a_full_size_gradient():
    model, X, y = model_and_data()
    step = wrong_zero.full_gradient_zero2_step
    passed, message = check_zero2_step(step, model, X, y, CONFIG)
    assert not passed
    assert message.startswith("FAIL: your step raised an error: ")
    assert "size" in message


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
            "FAIL: fully_shard was called without mesh=, so PyTorch picks a mesh "
            "itself: on a machine with a GPU a CUDA mesh, which moves the model to "
            "the GPU even though the ranks use gloo. Build "
            "mesh = init_device_mesh('cpu', (world_size,)) once and pass mesh=mesh "
            "to every fully_shard call.",
        ),
        (
            wrong_zero.root_only_fsdp2_rank,
            "FAIL: only the whole model is sharded, as one unit: every forward "
            "all-gathers all of its parameters at once. Call "
            "fully_shard(layer, mesh=mesh) on each Linear first (one all-gather per "
            "layer), then fully_shard(model, mesh=mesh).",
        ),
        (
            wrong_zero.torch_save_fsdp2_rank,
            "FAIL: the folder holds no DCP checkpoint (no .metadata file). "
            "torch.save on rank 0 writes only rank 0's shard; every rank must call "
            "dcp.save({'model': model.state_dict()}, checkpoint_id=checkpoint_dir), "
            "which writes one file per rank and the .metadata that maps them.",
        ),
        (
            wrong_zero.other_layout_fsdp2_rank,
            "FAIL: dcp.load looked for keys the checkpoint does not have: load with "
            "the same layout you saved. If you saved {'model': model.state_dict()}, "
            "load into state = {'model': fresh.state_dict()}, then "
            "fresh.load_state_dict(state['model']).",
        ),
        (
            wrong_zero.unloaded_fsdp2_rank,
            "away from the weights you saved: the checkpoint was not loaded into it. "
            "Load with dcp.load({'model': fresh.state_dict()}, "
            "checkpoint_id=checkpoint_dir) after the save, on every rank.",
        ),
    ],
    ids=["no mesh", "root only", "torch.save on rank 0", "other layout", "no load"],
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
