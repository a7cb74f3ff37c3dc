"""The ladder's wrappers, trained by multigpu.miniddp.train_with_strategy, train
exactly like PyTorch's DDP and like one process on the global batch.

Each world size starts its ranks once and runs every training check in that launch;
models and data are float64, so "equal" means equal to ~1e-15.
"""

import copy

import pytest

from multigpu import miniddp
from multigpu.allreduce_sgd import train_single_process as single_process
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import TrainConfig
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn

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
    return single_process(*problem, CONFIG)


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
