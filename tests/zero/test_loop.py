"""Tests for multigpu.zero.loop (and the launcher multigpu.ranks.zero.compare_stages):
every ZeRO stage trains like one process and like DDP, and sends what the
collectives count."""

import pytest
import torch
from torch.testing import assert_close

from multigpu import costmodel, zero
from multigpu.core.train import History
from multigpu.costmodel import ZERO_STAGES
from multigpu.ranks import zero as zero_ranks
from tests.zero.problem import CONFIG, EXACT, STEPS, model_and_data


def test_every_stage_trains_like_one_process_on_the_global_batch(trained):
    world_size, model, results, ddp, reference = trained
    assert isinstance(reference, History)
    assert len(reference.step_loss) == STEPS and len(reference.train_loss) == 1
    assert reference.step_loss[-1] < reference.step_loss[0]  # it does learn
    for stage in ZERO_STAGES:
        assert len(results[stage]) == world_size
        for rank, result in enumerate(results[stage]):
            assert isinstance(result, zero.ShardedHistory)
            assert (result.rank, result.world_size) == (rank, world_size)
            assert result.parameters.keys() == reference.parameters.keys()
            for name, value in reference.parameters.items():
                assert_close(result.parameters[name], value, **EXACT)
        # the mean of the ranks' losses is the loss on the global batch
        losses = torch.tensor([result.step_loss for result in results[stage]])
        assert_close(losses.mean(0), torch.tensor(reference.step_loss), **EXACT)
        epochs = torch.tensor([result.train_loss for result in results[stage]])
        assert_close(epochs.mean(0), torch.tensor(reference.train_loss), **EXACT)


def test_every_stage_trains_like_pytorch_ddp(trained):
    world_size, model, results, ddp, reference = trained
    for stage in ZERO_STAGES:
        for result, ddp_result in zip(results[stage], ddp, strict=True):
            for name, value in ddp_result.parameters.items():
                assert_close(result.parameters[name], value, **EXACT)


def test_the_weights_moved(trained):
    world_size, model, results, ddp, reference = trained
    start = model.state_dict()
    moved = max(
        (reference.parameters[name] - start[name]).abs().max().item() for name in start
    )
    assert moved > 0.5 * STEPS * CONFIG.lr  # Adam: up to about lr per step


def test_bytes_sent_equal_the_exact_counts(trained):
    world_size, model, results, ddp, reference = trained
    for stage in ZERO_STAGES:
        for rank, result in enumerate(results[stage]):
            expected = costmodel.zero_bytes_sent_per_rank(
                stage, zero.layer_numels(model), 8, world_size, rank
            )
            assert result.bytes_sent == [expected] * STEPS
            if world_size == 1:
                assert expected == 0


def test_bad_arguments_say_how_to_fix_them():
    with pytest.raises(ValueError) as error:
        zero.make_mlp((10,))
    assert str(error.value) == (
        "make_mlp needs at least two sizes (inputs and outputs), got (10,). Pass "
        "e.g. sizes=(10, 32, 5)."
    )
    model, X, y = model_and_data()
    with pytest.raises(ValueError) as error:
        zero_ranks.compare_stages(model, X, y, CONFIG, 2, stages=["zero3"])
    assert str(error.value) == (
        "Unknown stage 'zero3'. Choose one of: DDP, ZeRO-1, ZeRO-2, ZeRO-3."
    )
