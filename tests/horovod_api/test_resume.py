"""The walk-through's resume without ``hvd.broadcast_optimizer_state``: only rank 0
restored the momentum, so after one more step the ranks disagree (12)."""

from multigpu.ranks.horovod_api import resume_rank
from multigpu.runtime.launch import in_one_launch, spawn


def test_without_the_optimizer_broadcast_the_ranks_drift_apart():
    calls = [(resume_rank, (False,)), (resume_rank, (True,))]
    results = spawn(in_one_launch, 2, calls, timeout=60.0, deadline=120.0)
    assert results == [[False, True], [False, True]]
