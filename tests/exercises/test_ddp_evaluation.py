"""The checkers of notebook 09's exercises (multigpu.exercises.ddp_evaluation):
the reference evaluation passes, each mistake learners make is named; the weights
check of exercise 3 names the wrapper's prefix and a wrong run."""

import pytest
import torch

from multigpu.core.models import ConvNet
from multigpu.core.train import cpu_state_dict
from multigpu.ddp import evaluate_distributed
from multigpu.exercises.ddp_evaluation import (
    check_evaluation,
    check_trained_weights,
    evaluation_problem,
)
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
            "one rank, so they count twice; that is DistributedSampler's padding.",
        ),
        (
            wrong.divided_by_padded_total,
            "FAIL: you divided by 12 = world_size x "
            "ceil(N / world_size), the padded total.",
        ),
        (
            wrong.no_all_reduce,
            "FAIL: the ranks returned different numbers (rank "
            "0's numbers are its own shard's): each reported its own shard only.",
        ),
        (wrong.drops_the_remainder, "FAIL: samples [8, 9] were evaluated on no rank"),
        (wrong.returns_a_dict, "FAIL: returns_a_dict must return two numbers"),
    ],
)
def test_each_mistake_is_named(evaluation, expected):
    passed, message = check_evaluation(evaluation)
    assert not passed
    assert message.startswith(expected), message


def test_a_function_defined_in_the_notebook_is_refused_before_any_launch():
    def evaluation(model, X, y):
        return 0.0, 0.0

    evaluation.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in the notebook"):
        check_evaluation(evaluation)


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
    passed, message = check_trained_weights(
        {"w": reference["classifier.weight"]}, reference
    )
    assert not passed and "are not ConvNet's" in message
