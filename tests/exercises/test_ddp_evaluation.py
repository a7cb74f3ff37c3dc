"""The checkers of notebook 09's exercises (multigpu.exercises.ddp_evaluation):
the reference evaluation passes, each mistake learners make is named; the weights
check of exercise 3 names the wrapper's prefix and a wrong run."""

import pytest
import torch

from multigpu.allreduce_sgd import train_one_process
from multigpu.core.data import get_dataset, tensors
from multigpu.core.models import ConvNet
from multigpu.core.reproducibility import set_seed
from multigpu.core.train import TrainConfig, cpu_state_dict
from multigpu.ddp import evaluate_distributed
from multigpu.exercises.ddp_evaluation import (
    check_evaluation,
    check_trained_weights,
    evaluation_problem,
)
from multigpu.runtime.launch import in_one_launch, spawn
from tests.exercises import wrong_ddp_evaluation as wrong


def test_the_problem_predicts_four_of_ten_right():
    model, X, y = evaluation_problem()
    assert (model(X).argmax(1) == y).tolist() == [True] * 4 + [False] * 6
    assert model.seen == list(range(10))


def test_the_reference_passes():
    passed, message = check_evaluation(evaluate_distributed)
    assert passed, message
    assert message == (
        "PASS: evaluate_distributed counts each of the 10 samples once on 4 ranks "
        "and returns one process's loss and accuracy (0.40)."
    )


@pytest.mark.parametrize(
    "evaluation, expected",
    [
        (wrong.whole_set_on_every_rank, "FAIL: every rank evaluated all 10 samples"),
        (
            wrong.mean_of_rank_means,
            "FAIL: you averaged the ranks' means, but the "
            "shards have unequal sizes (3, 3, 2, 2)",
        ),
        (
            wrong.padded_sampler,
            "FAIL: samples [0, 1] were evaluated on more than "
            "one rank, so they count twice; that is DistributedSampler's padding, "
            "which repeats samples",
        ),
        (
            wrong.divided_by_padded_total,
            "FAIL: you divided by 12, the padded total (every rank counted as if it "
            "held as many samples as the longest shard), but only 10 samples exist",
        ),
        (
            wrong.no_all_reduce,
            "FAIL: the ranks returned different numbers (rank "
            "0's numbers are its own shard's): each reported its own shard only.",
        ),
        (wrong.drops_the_remainder, "FAIL: samples [8, 9] were evaluated on no rank"),
        (wrong.returns_a_dict, "FAIL: returns_a_dict must return two numbers"),
        (
            wrong.all_reduce_on_rank_0_only,
            "FAIL: rank 0 waited in a collective that not every rank called while "
            "ranks 1, 2, 3 had returned: a deadlock.",
        ),
        (wrong.raises, "FAIL: on rank 0, raises raised IndexError: "),
    ],
)
def test_each_mistake_is_named(evaluation, expected):
    passed, message = check_evaluation(evaluation)
    assert not passed
    assert message.startswith(expected), message
    # the mistake is named, the fix not dictated (no shard formula, no divisor)
    assert "arange" not in message and "ceil(" not in message, message


def test_a_function_defined_in_the_notebook_is_refused_before_any_launch():
    def evaluation(model, X, y):
        return 0.0, 0.0

    evaluation.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in the notebook"):
        check_evaluation(evaluation)


@pytest.fixture(scope="module")
def script_weights():
    """Rank 0's weights after exercise 3's script on 2 ranks, right and with each
    common mistake, and one process's reference."""
    calls = [(wrong.ddp_script_rank, (m,)) for m in wrong.SCRIPT_MISTAKES]
    runs = spawn(in_one_launch, 2, calls)[0]
    set_seed(0)
    X, y = tensors(get_dataset("digits", train=True))
    config = TrainConfig(epochs=2, batch_size=64, lr=0.05, momentum=0.9, seed=0)
    reference = train_one_process(ConvNet().double(), X[:256].double(), y[:256], config)
    return dict(zip(wrong.SCRIPT_MISTAKES, runs)), reference.parameters


@pytest.mark.parametrize(
    "mistake, expected",
    [
        ("none", "PASS: your script on 2 ranks ends at the weights of one process"),
        (
            "no set_epoch",
            "FAIL: your weights are those of a run in which every epoch repeats the "
            "first epoch's order",
        ),
        (
            "per-rank batch",
            "FAIL: your weights are those of a run with a global batch of 128: each "
            "rank's loader took 64 samples",
        ),
        (
            "no sampler",
            "FAIL: your weights are those of a run in which every rank loaded the "
            "same batches: without a DistributedSampler",
        ),
    ],
)
def test_each_script_mistake_gets_its_own_message(script_weights, mistake, expected):
    weights, reference = script_weights
    passed, message = check_trained_weights(weights[mistake], reference)
    assert passed == (mistake == "none")
    assert message.startswith(expected), message


def test_the_script_checker_leaves_the_learners_generators_alone(script_weights):
    weights, reference = script_weights
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_trained_weights(weights["no sampler"], reference)
    assert torch.equal(torch.rand(3), expected)


def test_trained_weights():
    torch.manual_seed(0)
    reference = cpu_state_dict(ConvNet().double())
    assert check_trained_weights(reference, reference)[0]
    prefixed = {f"module.{key}": value for key, value in reference.items()}
    passed, message = check_trained_weights(prefixed, reference)
    assert not passed and "start with 'module.'" in message
    moved = {key: value + 1e-6 for key, value in reference.items()}
    passed, message = check_trained_weights(moved, reference)
    assert not passed and message.startswith("FAIL: your weights are 1.0e-06 away")
    assert "and from what the common mistakes give" in message
    passed, message = check_trained_weights(
        {"w": reference["classifier.weight"]}, reference
    )
    assert not passed and "are not ConvNet's" in message
