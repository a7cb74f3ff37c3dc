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
from multigpu.runtime.launch import WorkerError, spawn
from tests.zero.problem import CONFIG, EXACT, STEPS, TIMEOUT, model_and_data


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


def learner_batches(num_samples=41, global_batch=10, world_size=2):
    """Global batches of a seeded order (the last 1 sample dropped), and each rank's
    equal half of each: the ranks' k-th batches together are the k-th global one."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(3))
    steps = num_samples // global_batch
    global_batches = [
        order[k * global_batch : (k + 1) * global_batch] for k in range(steps)
    ]
    per_rank = [
        [batch.tensor_split(world_size)[rank] for batch in global_batches]
        for rank in range(world_size)
    ]
    return global_batches, per_rank


def test_train_stage_takes_the_learners_batches_as_indices_or_pairs():
    model, X, y = model_and_data()
    X, y = X[:41], y[:41]
    global_batches, per_rank = learner_batches()
    reference = zero.train_one_process_adam(model, X, y, CONFIG, global_batches)
    pairs = [[(X[i], y[i]) for i in batches] for batches in per_rank]
    runs = [(stage, model, X, y, CONFIG, per_rank) for stage in ZERO_STAGES]
    runs += [(stage, model, None, None, CONFIG, pairs) for stage in ZERO_STAGES]
    results = spawn(zero_ranks.stages_rank, 2, runs, timeout=TIMEOUT)
    assert len(reference.step_loss) == 4
    for history in (h for per_rank_results in results for h in per_rank_results):
        assert len(history.step_loss) == 4
        for name, value in reference.parameters.items():
            assert_close(history.parameters[name], value, **EXACT)


def test_ranks_with_different_numbers_of_batches_are_refused_not_left_waiting():
    model, X, y = model_and_data()
    _, per_rank = learner_batches()
    per_rank[1] = per_rank[1][:3]  # rank 1 would stop one step early
    with pytest.raises(WorkerError) as error:
        zero_ranks.compare_stages(
            model, X, y, CONFIG, 2, stages=["ZeRO-2"], timeout=TIMEOUT, batches=per_rank
        )
    assert (
        "ValueError: The ranks got different numbers of batches (4, 3, by rank): "
        "each step is a collective, so every rank must take as many steps. Give "
        "every rank the same number of batches." in str(error.value)
    )
    assert not error.value.timed_out


def test_a_batch_that_is_neither_indices_nor_a_pair_is_refused():
    model, X, y = model_and_data()
    with pytest.raises(TypeError) as error:
        zero.train_one_process_adam(model, X, y, CONFIG, batches=[[1, 2, 3]])
    assert str(error.value) == (
        "Batch 0 is a list: each batch must be a tensor of sample indices into X and "
        "y, or an (inputs, labels) pair. Pass e.g. batches=[torch.arange(8), ...] or "
        "[(X[:8], y[:8]), ...]."
    )
    with pytest.raises(ValueError) as error:
        zero_ranks.compare_stages(model, X, y, CONFIG, 2, batches=[[]])
    assert str(error.value) == (
        "batches holds 1 ranks' batches for 2 ranks. Pass one list of batches per "
        "rank, by rank."
    )
