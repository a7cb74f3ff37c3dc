"""Tests for tests/ranks/__init__.py: the rank functions and training steps only the
tests use misbehave where they should, and only there."""

import pickle

import pytest
import torch

from multigpu.ranks import collectives as collective_ranks
from tests import ranks as test_ranks


def test_the_misbehaving_workers_misbehave_only_on_their_rank():
    # Called in this process: the ranks that behave return at once.
    assert collective_ranks.stuck_outside_collectives_rank(0, 2, 1) == 0
    assert test_ranks.exit_without_returning_rank(0, 2, 1) == 0
    assert test_ranks.raise_unprintable_rank(0, 2, 1) == 0
    assert test_ranks.result_that_fails_to_unpickle_rank(0, 2, 1) == 0


def test_the_faulty_objects_fail_where_they_should():
    with pytest.raises(RuntimeError, match="cannot be turned into text"):
        str(test_ranks.UnprintableError())
    data = pickle.dumps(test_ranks.RefusesToUnpickle())  # pickling works ...
    with pytest.raises(ValueError, match="cannot be rebuilt outside the rank"):
        pickle.loads(data)  # ... unpickling does not


@pytest.mark.parametrize(
    "step",
    [
        test_ranks.step_all_reducing_each_gradient,
        test_ranks.step_without_all_reduce,
        test_ranks.step_summing_without_dividing,
        test_ranks.step_returning_the_ranks_summed_loss,
    ],
    ids=lambda step: step.__name__,
)
def test_the_training_steps_are_sgd_steps_in_one_process(step):
    # Their mistakes are in what the ranks exchange, so with distributed=False each
    # takes sgd_step's step (check_step's tests show each mistake on ranks).
    from multigpu.allreduce_sgd import sgd_step
    from multigpu.core.models import ConvNet
    from multigpu.core.train import TrainConfig

    torch.manual_seed(0)
    X, y = torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,))
    results = []
    for run in (sgd_step, step):
        torch.manual_seed(1)
        model = ConvNet(in_channels=1, num_classes=3, width=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = [run(model, optimizer, X, y, TrainConfig()) for _ in range(2)]
        results.append((losses, model.state_dict()))
    (expected_losses, expected), (losses, weights) = results
    assert losses == expected_losses
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
