"""Set-up shared by the tests of multigpu.tensor_parallel: one launch per world size
(1, 2, 4) runs every rank function of notebook 15 on the shared problem."""

import pytest
import torch

from multigpu.ranks import tensor_parallel as tp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.tensor_parallel.problem import (
    TIMEOUT,
    block_and_data,
    large_logits,
    lm_and_data,
)

CALLS = (
    "tp dropout",
    "sp dropout",
    "tp",
    "sp",
    "sp float32",
    "lm",
    "dtensor tp",
    "dtensor sp",
    "dtensor lm",
    "cross-entropy",
)


@pytest.fixture(scope="package", params=[1, 2, 4], ids=lambda n: f"world{n}")
def launched(request):
    """(world_size, {call name: each rank's result, by rank}); at 4 ranks also
    "2-D": FSDP2 x TP on a 2x2 mesh."""
    world_size = request.param
    dropped, x, grad_out = block_and_data(dropout=0.25)
    block, _, _ = block_and_data()
    block32, x32, grad_out32 = block_and_data(torch.float32)
    lm, tokens, target = lm_and_data()
    calls = [
        (tp_ranks.block_rank, (dropped, x, grad_out, False, 5)),
        (tp_ranks.block_rank, (dropped, x, grad_out, True, 5)),
        (tp_ranks.block_rank, (block, x, grad_out, False)),
        (tp_ranks.block_rank, (block, x, grad_out, True)),
        (tp_ranks.block_rank, (block32, x32, grad_out32, True)),
        (tp_ranks.lm_rank, (lm, tokens, target)),
        (tp_ranks.dtensor_block_rank, (block, x, grad_out, False)),
        (tp_ranks.dtensor_block_rank, (block, x, grad_out, True)),
        (tp_ranks.dtensor_lm_rank, (lm, tokens, target)),
        (tp_ranks.cross_entropy_rank, large_logits()),
    ]
    names = list(CALLS)
    if world_size == 4:
        generator = torch.Generator().manual_seed(5)
        X = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
        Y = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
        calls.append((tp_ranks.two_d_rank, (block, X, Y, 3, 0.1)))
        names.append("2-D")
    per_rank = spawn(in_one_launch, world_size, calls, timeout=TIMEOUT)
    return world_size, {
        name: [results[i] for results in per_rank] for i, name in enumerate(names)
    }
