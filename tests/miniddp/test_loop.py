"""The ladder's wrappers, trained by multigpu.miniddp.train_with_strategy, train
exactly like PyTorch's DDP and like one process on the global batch: on ConvNet and
on the hard cases (tests/hard_cases.py), in float64 and float32, on 2-4 ranks.

Each world size starts its ranks once and runs every training check in that launch;
in float64 "equal" means equal to ~1e-15.
"""

import copy
import functools

import pytest
import torch

from multigpu import miniddp
from multigpu.allreduce_sgd import train_one_process as one_process
from multigpu.core.batches import run_batches
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import TrainConfig
from multigpu.miniddp import global_batch_shares
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.hard_cases import (
    DTYPES,
    REPLICATED_WORLD_SIZES,
    assert_kept,
    cases_for,
    hard_case_data,
)
from tests.ranks import miniddp_from_own_seed_rank

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
TIMEOUT = 30.0
# Small buckets, so that ConvNet(width=4)'s gradients need several of them.
OPTIONS = {"bucket_cap_mb": 0.002}


@pytest.fixture
def problem(convnet_problem):
    return convnet_problem(NUM_SAMPLES)


@pytest.fixture
def reference(problem):
    return one_process(*problem, CONFIG)


@pytest.fixture(scope="module")
def launches():
    """The results of each world size's launch, kept for the module's tests."""
    return {}


@pytest.fixture(params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem, launches):
    """Every strategy, without and with no_sync accumulation, in one launch per
    world size (the first test of a world size starts it; the others reuse it)."""
    if request.param not in launches:
        model, X, y = problem
        calls = [
            (
                miniddp_ranks.compare_rank,
                (model, X, y, CONFIG, miniddp.STRATEGIES, OPTIONS),
            ),
            (
                miniddp_ranks.compare_rank,
                (model, X, y, CONFIG, miniddp.STRATEGIES, OPTIONS, 2),
            ),
        ]
        launches[request.param] = spawn(
            in_one_launch, request.param, calls, timeout=TIMEOUT
        )
    return launches[request.param]


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
@pytest.mark.parametrize("accumulated", [False, True], ids=["plain", "no_sync"])
def test_every_strategy_trains_like_one_process_and_like_torch_ddp(
    runs, reference, strategy, accumulated
):
    per_rank = [results[int(accumulated)] for results in runs]
    ours = per_rank[0][strategy]
    assert max_parameter_difference(ours.parameters, reference.parameters) < 1e-12
    torch_ddp = per_rank[0]["torch"]
    assert max_parameter_difference(ours.parameters, torch_ddp.parameters) < 1e-12
    for other in per_rank[1:]:  # every rank ends with the same weights
        assert (
            max_parameter_difference(other[strategy].parameters, ours.parameters) == 0
        )
    assert len(ours.step_loss) == len(reference.step_loss)


def test_fp16_compression_hook_is_close_but_not_equal(problem):
    model, X, y = problem
    # .float() converts in place: a copy, so the problem stays as built
    model, X = copy.deepcopy(model).float(), X.float()
    calls = [
        (miniddp_ranks.train_rank, (model, X, y, CONFIG, "torch", None, 1, compress))
        for compress in (False, True)
    ]
    plain, compressed = spawn(in_one_launch, 2, calls, timeout=TIMEOUT)[0]
    difference = max_parameter_difference(plain.parameters, compressed.parameters)
    assert 0 < difference < 1e-2


# ----------------------------------------------------------------------------------
# The hard cases (tests/hard_cases.py: those the registry says miniddp trains like
# one process), 41 samples on 2 and 4 ranks (REPLICATED_WORLD_SIZES), global batches
# no world size divides (uneven shares; an
# empty one for 3 samples on 4 ranks), float32 and float64, every rank building its
# model from its own seed. Each case runs every strategy on batches of 5, and on
# batches of 3 in two micro-batches (no_sync), or in one where the forward counts
# its calls; in float64 also the bucketed wrappers with buckets of a gradient or two.

HARD_CONFIGS = {  # one epoch each (8 and 13 steps): the ConvNet runs reshuffle
    "batch5": TrainConfig(epochs=1, batch_size=5, lr=0.2, momentum=0.5, seed=3),
    "batch3": TrainConfig(epochs=1, batch_size=3, lr=0.2, momentum=0.5, seed=4),
}
HARD_SEED = 7
# float64 differs from one process by rounding only; float32 by float32 rounding
# over up to 13 steps (measured: 8.9e-8 over 26).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}
HARD_CASES = cases_for("miniddp")
TINY_BUCKETS = 0.0002  # MB: a bucket or two per gradient


def hard_runs_of(case, dtype):
    """(config name, options, strategies, accumulation) of each run of ``case``."""
    find_unused = {"find_unused_parameters": case.find_unused_parameters}
    accumulation = 2 if case.one_forward_per_step else 1
    runs = [
        ("batch5", find_unused, miniddp.STRATEGIES, 1),
        ("batch3", find_unused, miniddp.STRATEGIES, accumulation),
    ]
    if dtype == torch.float64:
        tiny = {**find_unused, "bucket_cap_mb": TINY_BUCKETS}
        runs.append(("batch5", tiny, ("bucketed", "torch"), 1))
    return runs


def hard_case_calls():
    """Every hard case in both dtypes: ((case, dtype, run index), rank call)."""
    calls = []
    for dtype in DTYPES:
        X, y = hard_case_data(dtype=dtype)
        for case in HARD_CASES:
            for index, run in enumerate(hard_runs_of(case, dtype)):
                config_name, options, strategies, accumulation = run
                build = functools.partial(case.build, dtype)
                args = (build, HARD_SEED, X, y, HARD_CONFIGS[config_name])
                call = (strategies, options, accumulation)
                calls.append(
                    ((case, dtype, index), (miniddp_from_own_seed_rank, (*args, *call)))
                )
    return calls


@pytest.fixture(scope="module")
def hard_runs():
    """{world_size: {(case, dtype, run index): per-rank {strategy: History}}}, one
    launch per world size."""
    runs = {}
    calls = hard_case_calls()
    for world_size in REPLICATED_WORLD_SIZES:
        per_rank = spawn(
            in_one_launch, world_size, [call for _, call in calls], timeout=120.0
        )
        runs[world_size] = {
            key: [results[i] for results in per_rank]
            for i, (key, _) in enumerate(calls)
        }
    return runs


@pytest.mark.parametrize(
    "world_size", REPLICATED_WORLD_SIZES, ids=lambda n: f"world{n}"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_wrapper_equals_one_process_on_the_hard_cases(
    hard_runs, world_size, dtype
):
    X, y = hard_case_data(dtype=dtype)
    for (case, run_dtype, index), per_rank in hard_runs[world_size].items():
        if run_dtype != dtype:
            continue
        config_name, _, strategies, _ = hard_runs_of(case, dtype)[index]
        config = HARD_CONFIGS[config_name]
        reference = one_process(case.build(dtype, HARD_SEED), X, y, config)
        initial = case.build(dtype, HARD_SEED).state_dict()
        for strategy in strategies:
            where = f"{strategy}, {case.name}, run {index}, {config_name}"
            ours = per_rank[0][strategy]
            difference = max_parameter_difference(ours.parameters, reference.parameters)
            assert difference < TOLERANCE[dtype], where
            assert len(ours.step_loss) == len(reference.step_loss), where
            for other in per_rank[1:]:  # rank 0's start; every rank the same end
                assert other[strategy].parameters.keys() == ours.parameters.keys()
                assert (
                    max_parameter_difference(
                        other[strategy].parameters, ours.parameters
                    )
                    == 0
                ), where
            # The mean of the ranks' shares of the loss is the global batch's.
            losses = [
                sum(losses) / world_size
                for losses in zip(*(r[strategy].step_loss for r in per_rank))
            ]
            assert (
                max(abs(a - b) for a, b in zip(losses, reference.step_loss))
                < 1e3 * TOLERANCE[dtype]
            ), where
            assert_kept(case, initial, ours.parameters, where)  # frozen, tied, ...


def test_global_batch_shares_split_the_one_process_batches():
    config = TrainConfig(epochs=2, batch_size=3, seed=5)
    single, steps = global_batch_shares(41, config)
    assert steps == 13 and len(single) == 26
    for world_size in (2, 3, 4):
        shares = [
            global_batch_shares(41, config, world_size, rank)[0]
            for rank in range(world_size)
        ]
        for step, batch in enumerate(single):
            parts = [shares[rank][step] for rank in range(world_size)]
            assert sorted(torch.cat(parts).tolist()) == sorted(batch.tolist())
            assert [len(p) for p in parts] == [
                len(range(rank, 3, world_size)) for rank in range(world_size)
            ]
    assert [len(s) for s in global_batch_shares(41, config, 4, 3)[0]] == [0] * 26
    even = TrainConfig(epochs=2, batch_size=8, seed=5)
    for rank in range(4):  # where the world divides the batch: run_batches' indices
        ours, steps = global_batch_shares(41, even, 4, rank)
        theirs, their_steps = run_batches(41, even, 4, rank)
        assert steps == their_steps
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_global_batch_shares_refuse_a_batch_larger_than_the_data():
    with pytest.raises(ValueError) as error:
        global_batch_shares(4, TrainConfig(batch_size=5))
    assert str(error.value) == (
        "The global batch of 5 is larger than the 4 samples, so not even one full "
        "batch fits. Use a global batch of at most 4."
    )
