"""DistributedDataParallel trains exactly like one process on the global batch."""

import pytest
import torch

from multigpu.core.compare import max_parameter_difference
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import WorkerError, spawn
from tests.ddp.problems import CONFIG, STEPS, assert_same, make_problem


def test_reference_training_moves_the_weights(problem, reference):
    model, _, _ = problem
    assert max_parameter_difference(reference.parameters, model.state_dict()) > 1e-2
    assert len(reference.step_loss) == STEPS


def test_ddp_equals_one_process_on_the_global_batch(runs, reference):
    for result in runs["compare"]:
        assert len(result["ddp"].step_loss) == STEPS
        assert_same(reference.parameters, result["ddp"].parameters)


def test_ddp_equals_hand_written_allreduce_sgd(runs):
    for result in runs["compare"]:
        assert_same(result["allreduce_sgd"].parameters, result["ddp"].parameters)
        torch.testing.assert_close(
            torch.tensor(result["ddp"].step_loss),
            torch.tensor(result["allreduce_sgd"].step_loss),
        )


def test_epoch_losses_are_averaged_over_the_ranks(runs, reference):
    for result in runs["compare"]:
        by_epoch = torch.tensor(reference.step_loss).view(CONFIG.epochs, -1).mean(1)
        torch.testing.assert_close(torch.tensor(result["ddp"].train_loss), by_epoch)


def test_reference_syncbn_equals_plain_batchnorm_on_the_global_batch(
    runs, bn_reference
):
    for result in runs["syncbn"]:
        assert_same(bn_reference.parameters, result.parameters)


# With one rank, per-rank BatchNorm is the global batch: nothing to show.
@pytest.mark.parametrize("runs", [2, 4], indirect=True, ids=["world2", "world4"])
def test_per_rank_batchnorm_differs_from_the_global_batch(runs, bn_reference):
    difference = max_parameter_difference(
        runs["plain bn"][0].parameters, bn_reference.parameters
    )
    # Per-rank statistics change every step: far more than rounding (1e-15).
    assert difference > 1e-3
    print(f"per-rank BatchNorm vs global batch: max |weight difference| {difference}")


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_join_lets_uneven_ranks_finish(runs):
    assert runs["join"] == [1, 2]


def test_uneven_inputs_without_join_time_out():
    model, X, y = make_problem()
    with pytest.raises(WorkerError) as caught:
        spawn(
            ddp_ranks.uneven_inputs_rank,
            2,
            model.float(),
            X.float(),
            y,
            False,
            timeout=5.0,
        )
    assert caught.value.rank == 1  # waited for an all-reduce rank 0 never joined
    assert "Timed out" in str(caught.value)


@pytest.mark.gpu(2)
def test_nccl_ddp_equals_one_process(problem, reference):
    model, X, y = problem
    histories = ddp_ranks.train_ddp(model, X, y, CONFIG, 2, backend="nccl")
    for history in histories:
        for key, tensor in reference.parameters.items():
            torch.testing.assert_close(history.parameters[key], tensor)
