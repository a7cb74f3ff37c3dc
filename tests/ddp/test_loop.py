"""DistributedDataParallel trains exactly like one process on the global batch."""

import copy
import math

import pytest
import torch

from multigpu.allreduce_sgd import train_one_process
from multigpu.core.compare import max_parameter_difference
from multigpu.core.data import epoch_order
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import WorkerError, spawn
from tests.ddp.problems import (
    CONFIG,
    HARD_BATCH,
    STEPS,
    assert_same,
    hard_config,
    make_problem,
)
from tests.hard_cases import (
    DTYPES,
    NUM_SAMPLES,
    assert_kept,
    cases_for,
    hard_case_data,
    hard_case_model,
)


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


# The hard cases (tests/hard_cases.py: those the registry says DDP trains like one
# process) on 2, 3 and 4 ranks, each rank building its model from seed + rank: DDP
# broadcasts rank 0's, so one process starts from seed 0.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}
HARD_CASES = cases_for("ddp")


def one_process(case, dtype, config):
    X, y = hard_case_data(dtype=dtype)
    return train_one_process(case.build(dtype, 0), X, y, config)


def padded_one_process(model, X, y, config, world_size):
    """One process on the global batches the padded sampler gives ``world_size``
    ranks: each epoch's order padded with its own first indices up to
    ``ceil(N / W) * W``, cut into global batches, as many as a rank's padded shard
    holds per-rank batches. Its final parameters."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    num_samples, batch = len(X), config.batch_size
    per_rank, shard = batch // world_size, math.ceil(len(X) / world_size)
    for epoch in range(config.epochs):
        order = epoch_order(num_samples, config.seed, epoch)
        padded = torch.cat([order, order[: shard * world_size - num_samples]])
        for step in range(shard // per_rank):
            indices = padded[step * batch : (step + 1) * batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(X[indices]), y[indices]).backward()
            optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("case", HARD_CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ddp_equals_one_process_on_the_hard_cases(hard_runs, case, dtype):
    world_size = len(hard_runs["padded"])
    config = hard_config(world_size)
    reference = one_process(case, dtype, config)
    assert len(reference.step_loss) == config.epochs * (
        NUM_SAMPLES // HARD_BATCH[world_size]
    )
    start = case.build(dtype, 0).state_dict()  # rank 0's
    difference = 0.0
    for result in hard_runs[(case.name, dtype)]:
        history = result["history"]
        assert len(history.step_loss) == len(reference.step_loss)
        assert history.parameters.keys() == reference.parameters.keys()
        for key, tensor in reference.parameters.items():
            torch.testing.assert_close(
                history.parameters[key], tensor, rtol=0, atol=TOLERANCE[dtype]
            )
        assert_kept(case, start, history.parameters)  # frozen, tied, unused, ...
        difference = max(
            difference,
            max_parameter_difference(history.parameters, reference.parameters),
        )
    print(
        f"{world_size} ranks, {case.name}, {dtype}: max |DDP - one process| "
        f"{difference:.2g}"
    )


@pytest.mark.parametrize("case", HARD_CASES, ids=lambda case: case.name)
def test_ranks_built_from_their_own_seeds_start_different(hard_runs, case):
    """Where the seed changes the weights, the ranks did start apart."""
    first = case.build(torch.float64, 0).state_dict()
    second = case.build(torch.float64, 1).state_dict()
    apart = any(not torch.equal(first[k], second[k]) for k in first)
    for dtype in DTYPES:
        for result in hard_runs[(case.name, dtype)]:
            assert result["differed before"] == apart


def test_padded_sampler_adds_steps_and_equals_padding_emulated(hard_runs):
    world_size = len(hard_runs["padded"])
    config = hard_config(world_size)
    X, y = hard_case_data()
    model = hard_case_model(torch.float64, 0)
    emulated = padded_one_process(model, X, y, config, world_size)
    exact = train_one_process(model, X, y, config)
    for result in hard_runs["padded"]:
        history = result["history"]
        # one step more per epoch than one process: 7 instead of 6, 11 instead of 10
        assert len(history.step_loss) == len(exact.step_loss) + config.epochs
        assert max_parameter_difference(history.parameters, exact.parameters) > 1e-2
        assert_same(emulated, history.parameters)


def test_global_batch_larger_than_the_data_is_refused(hard_runs):
    for result in hard_runs["batch too big"]:
        assert result["error"] == (
            "The global batch of 60 is larger than the 41 samples, so not even one "
            "full batch fits. Use a global batch of at most 41."
        )


def test_unused_parameter_without_find_unused_parameters_is_refused(hard_runs):
    for result in hard_runs["no find_unused"]:
        assert "parameters that were not used in producing loss" in result["error"]
        assert "find_unused_parameters=True" in result["error"]
