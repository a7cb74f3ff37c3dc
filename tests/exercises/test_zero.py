"""Tests for multigpu.exercises.zero: 13's checker passes the reference ZeRO-2 step
and names each mistake."""

import inspect

import pytest

from multigpu import zero
from multigpu.exercises.zero import check_zero2_step
from multigpu.runtime import scratch
from multigpu.runtime.launch import WorkerNotImportableError
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
    assert "divide it by the world size" in message


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
