"""The ranks that 09b runs to count SyncBatchNorm's exchanges and to stop every
rank on a non-finite loss (multigpu.ranks.ddp): what the lesson prints is what
they return, on every rank."""

import torch

from multigpu.core.models import ConvNet
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.ddp.problems import TIMEOUT


def test_syncbn_exchanges_one_per_layer_and_none_in_eval_mode():
    torch.manual_seed(0)
    model = ConvNet(width=4, batch_norm=True).double()  # 2 BatchNorm layers
    X, y = torch.randn(16, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (16,))
    per_rank = spawn(ddp_ranks.syncbn_exchanges_rank, 2, model, X, y, timeout=TIMEOUT)
    expected = {  # [forward, backward, DDP's buckets]
        "reference, whole model trains": [2, 2, 1],
        "reference, frozen, train mode": [2, 0, 1],
        "reference, frozen, eval mode": [0, 0, 1],
        "nn.SyncBatchNorm, frozen, eval mode": [0, 0, 0],
    }
    assert per_rank == [expected, expected]


def test_a_nonfinite_loss_on_one_rank_stops_every_rank_at_the_same_step():
    torch.manual_seed(0)
    model = ConvNet(width=4)
    X, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    calls = [
        (ddp_ranks.nonfinite_loss_rank, (model, X, y, 2, check))
        for check in (True, False)
    ]
    (checked0, unchecked0), (checked1, unchecked1) = spawn(
        in_one_launch, 2, calls, timeout=TIMEOUT
    )
    assert checked0 == {"stopped at": 2, "own loss finite": True, "finite": True}
    assert checked1 == {"stopped at": 2, "own loss finite": False, "finite": True}
    for unchecked in (unchecked0, unchecked1):  # the NaN reached every rank
        assert unchecked == {
            "stopped at": None,
            "own loss finite": True,
            "finite": False,
        }
