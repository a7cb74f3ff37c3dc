"""Set-up shared by the tests of multigpu.zero: every stage trained once per world
size, in one launch, with PyTorch's DDP and one process beside it."""

import pytest

from multigpu import zero
from multigpu.ranks import zero as zero_ranks
from multigpu.runtime.launch import spawn
from tests.zero.problem import CONFIG, TIMEOUT, model_and_data


@pytest.fixture(scope="package", params=[1, 2, 4], ids=lambda n: f"world{n}")
def trained(request):
    """(world_size, model, {stage: each rank's ShardedHistory}, each rank's DDP
    History, one process's History)."""
    world_size = request.param
    model, X, y = model_and_data()  # 1,573 parameters: unequal shards from 2 on
    results = zero_ranks.compare_stages(
        model, X, y, CONFIG, world_size, timeout=TIMEOUT
    )
    ddp = spawn(zero_ranks.ddp_rank, world_size, model, X, y, CONFIG, timeout=TIMEOUT)
    reference = zero.train_one_process_adam(model, X, y, CONFIG)
    return world_size, model, results, ddp, reference
