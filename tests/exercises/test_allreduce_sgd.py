"""The checker of notebook 08's exercise, where the learner writes the step
(multigpu.exercises.allreduce_sgd.check_step): it passes a right step, names each
mistake, and refuses a step the ranks cannot import before any process starts."""

import re
import types

import pytest
import torch

from multigpu.allreduce_sgd import sgd_step
from multigpu.core.train import TrainConfig
from multigpu.exercises.allreduce_sgd import check_step
from multigpu.ranks.allreduce_sgd import compare_data_parallel, train_data_parallel
from multigpu.runtime.launch import WorkerNotImportableError
from tests import ranks
from tests.exercises import wrong_allreduce_sgd as wrong

NUM_SAMPLES = 40  # 2 full global batches of 16 per epoch; 8 samples left over
CONFIG = TrainConfig(epochs=3, batch_size=16, lr=0.2, momentum=0.5, seed=3)
STEPS = 6  # steps per rank: 3 epochs x 2 full global batches


@pytest.fixture
def problem64(convnet_problem):
    """A tiny ConvNet and random 8x8 images in float64, as notebook 08 trains:
    (model, X (40, 1, 8, 8), y (40,))."""
    return convnet_problem(NUM_SAMPLES)


@pytest.fixture
def problem(problem64):
    """The same problem in float32."""
    model, X, y = problem64
    return model.float(), X.float(), y


def step_forward_only(model, optimizer, X, y, config, distributed=False):
    """The exercise's skeleton: a forward pass, nothing else."""
    optimizer.zero_grad()
    return torch.nn.functional.cross_entropy(model(X), y).item()


def step_without_zero_grad(model, optimizer, X, y, config, distributed=False):
    """Mistake: gradients add up over the steps."""
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_returning_the_batch_sum(model, optimizer, X, y, config, distributed=False):
    """Mistake: trains like sgd_step, returns the loss summed over the batch."""
    return sgd_step(model, optimizer, X, y, config, distributed) * len(y)


@pytest.mark.parametrize(
    "step",
    [sgd_step, ranks.step_all_reducing_each_gradient, wrong.clears_gradients_by_hand],
    ids=lambda s: s.__name__,
)
def test_check_step_passes_a_correct_step(problem64, step):
    passed, message = check_step(step, *problem64, CONFIG, world_size=2)
    assert passed, message
    assert message == (
        "PASS: in one process and on 2 ranks your step trains like sgd_step: the "
        f"same weights, and the same loss at each of the {STEPS} steps (within 1e-9)."
    )


def test_check_step_defaults_to_a_looser_tolerance_in_float32(problem):
    passed, message = check_step(sgd_step, *problem, CONFIG, world_size=2)
    assert passed and message.endswith("(within 1e-3).")


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (step_forward_only, "never changed the weights"),
        (step_without_zero_grad, r"in one process \(distributed=False\) your step "),
        (step_returning_the_batch_sum, "not the mean loss over its batch"),
        (ranks.step_without_all_reduce, "the 2 ranks ended with different weights"),
        (ranks.step_summing_without_dividing, "Divide the summed gradients"),
        (
            ranks.step_returning_the_ranks_summed_loss,
            "on the ranks your step returns",
        ),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_check_step_names_the_mistake(problem64, step, words):
    passed, message = check_step(step, *problem64, CONFIG, world_size=2)
    assert not passed
    assert message.startswith("FAIL: ")
    assert re.search(words, message), message


def test_a_step_the_ranks_cannot_import_is_refused_before_any_process_starts(
    problem64,
):
    def nested(model, optimizer, X, y, config, distributed=False):
        return 0.0

    with pytest.raises(WorkerNotImportableError, match="inside a function"):
        check_step(nested, *problem64, CONFIG)
    with pytest.raises(WorkerNotImportableError, match="ranks cannot import it"):
        train_data_parallel(*problem64, CONFIG, world_size=2, step=nested)
    # The function as it was before its module was imported again: same names,
    # another object, so the ranks would run a different one.
    current = ranks.step_without_all_reduce
    stale = types.FunctionType(current.__code__, current.__globals__, current.__name__)
    stale.__qualname__ = current.__qualname__
    with pytest.raises(WorkerNotImportableError, match="import it again"):
        compare_data_parallel(*problem64, {"run": CONFIG}, 2, step=stale)


def test_a_step_that_all_reduces_in_one_process_is_a_fail_not_a_traceback(problem64):
    passed, message = check_step(wrong.all_reduce_always, *problem64, CONFIG)
    assert not passed
    assert message.startswith(
        "FAIL: in one process (distributed=False) your step called "
        "torch.distributed, which needs a process group, and there is none: "
        "ValueError: "
    ), message
    assert message.endswith("communicate only when distributed is True."), message


def test_clearing_the_gradients_between_backward_and_step_is_named(problem64):
    passed, message = check_step(
        wrong.zero_grad_between_backward_and_step, *problem64, CONFIG
    )
    assert not passed
    assert message == (
        "FAIL: your step never changed the weights: the gradients were cleared "
        "between backward and the optimizer step, so optimizer.step() found no "
        "gradients to apply. Clear them before this step's backward pass, so that "
        "the step applies what its own backward computed."
    )


def test_a_step_that_never_steps_is_named(problem64):
    passed, message = check_step(wrong.backward_without_step, *problem64, CONFIG)
    assert not passed
    assert message == (
        "FAIL: your step computes gradients but never changes the weights: it "
        "never calls optimizer.step() after backward."
    )


def test_an_exception_in_the_step_is_a_fail(problem64):
    passed, message = check_step(wrong.raises_on_a_wrong_shape, *problem64, CONFIG)
    assert not passed
    assert message.startswith("FAIL: in one process your step raised RuntimeError: ")


def test_an_all_reduce_on_rank_0_only_is_a_fail_naming_the_stuck_collective(
    problem64,
):
    passed, message = check_step(wrong.all_reduce_on_rank_0_only, *problem64, CONFIG)
    assert not passed
    assert message.startswith(
        "FAIL: on 2 ranks the ranks stopped waiting for each other: a collective "
    ), message
