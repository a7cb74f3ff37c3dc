"""Few launches for all of lesson 19's equalities: one 8-rank world runs the three
2 x 2 x 2 grids (each of dp, tp, pp and cp in two of them) by hand in float64 and
float32 on uneven batches, and by hand and with PyTorch's APIs side by side in
float64 on batches PyTorch's pipelining can take (on the two grids that hold
FSDP2, TP, PP and CP); one 16-rank world runs the full
2 x 2 x 2 x 2 by hand; one 2-rank world runs every pipeline schedule."""

import warnings

import pytest

from multigpu.gpt4d.grid import Grid
from multigpu.ranks.gpt4d import run_grids, run_schedules

GRIDS_8 = (Grid(dp=2, tp=2, pp=2), Grid(dp=2, pp=2, cp=2), Grid(tp=2, pp=2, cp=2))
# PyTorch's version on the grids with FSDP2 (dp, and dp x cp flattened), TP and PP
TORCH_GRIDS = GRIDS_8[:2]
FULL_16 = Grid(dp=2, tp=2, pp=2, cp=2)
UNEVEN = (6, 5, 7)  # sequences per step: dp 2 splits 5 and 7 unevenly
EVEN = (4, 4, 4)  # torch.distributed.pipelining needs one micro-batch shape
SCHEDULE_CASES = (
    ("gpipe", 4, False),
    ("1f1b", 4, False),
    ("interleaved-1f1b", 4, False),
    ("interleaved-zero-bubble", 4, False),
    ("zbv", 4, False),
    ("dualpipev", 4, False),
    ("1f1b", 4, True),
)
TIMEOUT = 120


@pytest.fixture(scope="package")
def eight_rank_runs():
    cases = [(g, "float64", "hand", UNEVEN) for g in GRIDS_8]
    cases += [(g, "float32", "hand", UNEVEN) for g in GRIDS_8]
    cases += [(g, "float64", "both", EVEN) for g in TORCH_GRIDS]
    return run_grids(cases, timeout=TIMEOUT)


@pytest.fixture(scope="package")
def sixteen_rank_runs():
    with warnings.catch_warnings():  # 16 ranks on 2 cores: the launcher warns
        warnings.filterwarnings("ignore", "world_size=16 starts 16 processes")
        return run_grids([(FULL_16, "float64", "hand", UNEVEN)], timeout=TIMEOUT)


@pytest.fixture(scope="package")
def schedule_runs():
    return run_schedules(SCHEDULE_CASES, timeout=TIMEOUT)
