"""hvd.init, rank, size, local_rank, local_size and shutdown, with hvd.allreduce and
allreduce_, give what Horovod's give; calls before init() and outside torchrun are
explained. The launches are in conftest.py."""

import re

import pytest
import torch
import torch.distributed as dist

from multigpu import horovod_api as hvd
from multigpu.runtime.rank import NotLaunchedByTorchrunError


def test_rank_size_and_allreduce_average_and_sum(runs):
    results = runs["api"]
    n = len(results)
    mean = torch.tensor([(n + 1) / 2, 10 * (n - 1) / 2], dtype=torch.float64)
    total = torch.tensor([n * (n + 1) / 2, 10 * n * (n - 1) / 2], dtype=torch.float64)
    for rank, result in enumerate(results):
        assert (result["rank"], result["size"]) == (rank, n)
        assert (result["local_rank"], result["local_size"]) == (rank, n)
        torch.testing.assert_close(result["average"], mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(result["sum"], total, rtol=0, atol=1e-12)
        in_place = result["in_place_average"]
        torch.testing.assert_close(in_place, mean, rtol=0, atol=1e-12)
        assert result["unchanged"] and result["in_place"]
        # shutdown() leaves spawn's process group alone; init() joins it again.
        assert result["after_shutdown"] == (False, True)
        assert result["after_init_again"]


NOT_INITIALIZED = (
    "hvd.{}() was called before hvd.init(), so there is no process group to ask. "
    "Call hvd.init() first, once at the start of the script (in a worker of "
    "multigpu.runtime.launch.spawn too)."
)


def test_calls_before_init_say_to_call_init_first():
    assert not hvd.is_initialized() and not dist.is_initialized()
    expected = re.escape(NOT_INITIALIZED.format("rank"))
    with pytest.raises(hvd.NotInitializedError, match=expected):
        hvd.rank()
    model = torch.nn.Linear(2, 2)
    for call, name in [
        (lambda: hvd.local_size(), "local_size"),
        (lambda: hvd.allreduce(torch.ones(2)), "allreduce"),
        (
            lambda: hvd.broadcast_parameters(model.state_dict(), 0),
            "broadcast_parameters",
        ),
        (
            lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.1)),
            "DistributedOptimizer",
        ),
    ]:
        with pytest.raises(ValueError, match=re.escape(NOT_INITIALIZED.format(name))):
            call()
    assert not hvd.is_initialized() and not dist.is_initialized()


def test_init_outside_torchrun_says_how_to_start_the_ranks(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NotLaunchedByTorchrunError, match="torchrun --nproc-per-node=N"):
        hvd.init()
    assert not hvd.is_initialized() and not dist.is_initialized()
