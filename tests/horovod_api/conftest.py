"""The launches the tests of multigpu.horovod_api share.

Each world size (1, 2, 4) starts its ranks once and runs every multi-process check
of tests/horovod_api in that launch (``in_one_launch``): starting processes costs
more than training. Models and data are float64, so "equal" means equal to ~1e-15.
The errors are checked in this process, on a process group of one rank
(``one_rank``).
"""

import pytest
import torch.distributed as dist

from multigpu import horovod_api as hvd
from multigpu.allreduce_sgd import train_one_process as one_process
from multigpu.ranks import horovod_api as hvd_ranks
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.horovod_api.problems import (
    CONFIG,
    FORMS,
    NUM_SAMPLES,
    TIMEOUT,
    TINY_MB,
)


@pytest.fixture
def problem(convnet_problem):
    return convnet_problem(NUM_SAMPLES)


@pytest.fixture
def reference(problem):
    return one_process(*problem, CONFIG)


@pytest.fixture(scope="session")
def launches():
    """The results of each world size's launch, kept for the tests of the folder."""
    return {}


@pytest.fixture(params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem, launches):
    """Every multi-process check of one world size, in one launch (the first test
    of a world size starts it; the others reuse it): {label: results by rank}."""
    if request.param not in launches:
        model, X, y = problem
        train = hvd_ranks.train_horovod_style_rank
        torch_ddp = miniddp_ranks.train_rank
        calls = {
            "one fusion": (train, (model, X, y, CONFIG)),
            "many fusions": (train, (model, X, y, CONFIG, 1, TINY_MB)),
            "accumulated": (train, (model, X, y, CONFIG, 2, TINY_MB)),
            "torch": (torch_ddp, (model, X, y, CONFIG, "torch")),
            "torch no_sync": (torch_ddp, (model, X, y, CONFIG, "torch", None, 2)),
            "fusion tiny": (hvd_ranks.fusion_rank, (model, X[:8], y[:8], TINY_MB)),
            "fusion default": (hvd_ranks.fusion_rank, (model, X[:8], y[:8], 128.0)),
            **{form: (hvd_ranks.broadcast_rank, (model, form)) for form in FORMS},
            "api": (hvd_ranks.api_rank, ()),
        }
        per_rank = spawn(
            in_one_launch, request.param, list(calls.values()), timeout=TIMEOUT
        )
        launches[request.param] = {
            label: [results[i] for results in per_rank] for i, label in enumerate(calls)
        }
    return launches[request.param]


@pytest.fixture
def one_rank():
    """A process group of one rank in this process, gone after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        hvd.init()
        yield
    finally:
        hvd.shutdown()
        dist.destroy_process_group()
    assert not dist.is_initialized()
