"""Gradient accumulation, the learning rate and AMP under DDP."""

import copy

import pytest
import torch

from multigpu import ddp
from multigpu.core.compare import max_parameter_difference
from multigpu.ranks import ddp as ddp_ranks
from tests.ddp.problems import CONFIG, STEPS, assert_same


def test_no_sync_accumulation_equals_one_step_on_the_combined_batch(runs, reference):
    for result in runs["no_sync"]:
        assert_same(reference.parameters, result.parameters)


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_before_forward_is_no_sync(runs, reference):
    for result in runs["flag_before_forward"]:
        assert_same(reference.parameters, result.parameters)


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_after_forward_diverges(runs):
    rank0, rank1 = runs["flag_after_forward"]
    assert max_parameter_difference(rank0.parameters, rank1.parameters) > 1e-3


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_flag_after_forward_syncs_the_wrong_micro_batch(runs):
    no_sync, before, after = runs["syncs"][0]
    assert no_sync == before == [0, 0, 1, 0, 0, 1]  # the last of each 3
    assert after == [1, 0, 0, 1, 0, 0]  # the first: it read the previous flag


def test_lr_scaling_is_explicit():
    assert ddp.scaled_lr(0.05, 4) == 0.05
    assert ddp.scaled_lr(0.05, 4, "linear") == 0.2
    with pytest.raises(ValueError):
        ddp.scaled_lr(0.05, 4, "sqrt")


def test_bfloat16_autocast_on_cpu_trains(problem):
    model, X, y = problem
    model = copy.deepcopy(model).float()  # .float() would change the fixture
    histories = ddp_ranks.train_ddp(model, X.float(), y, CONFIG, 1, amp=True)
    assert len(histories[0].step_loss) == STEPS
    assert all(torch.isfinite(torch.tensor(histories[0].step_loss)))


@pytest.mark.gpu(1)
def test_float16_autocast_with_grad_scaler_on_gpu(problem):
    model, X, y = problem
    model = copy.deepcopy(model).float()
    histories = ddp_ranks.train_ddp(
        model, X.float(), y, CONFIG, 1, backend="nccl", amp=True
    )
    assert all(torch.isfinite(torch.tensor(histories[0].step_loss)))
