"""The problem every test of multigpu.fsdp2 trains: the hard cases of
tests/hard_cases.py, in global steps of 12 samples (3 steps, or 2 steps of 2
micro-batches for accumulation), and the MLP whose bytes are counted."""

import torch

from multigpu import zero
from tests.hard_cases import hard_case_data

LR = 0.01
TIMEOUT = 180.0  # the machine may be shared; a hang fails instead of waiting forever
# float64: the ranks add in another order (~1e-17 measured); float32 ~1e-7
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
BF16_BOUND = 5e-3  # bf16 parameters, fp32 reductions, 3 Adam steps: 6e-4 measured
MAX_NORM = 0.05  # below the gradients' norms (0.2-0.3): clipping does clip
# (reshard_after_forward, mixed precision) of reshard_rank, on 4 ranks
SETTINGS = [(True, False), (False, False), (2, False), (False, True), (2, True)]


def global_steps(dtype=torch.float64, micro_batches=1, steps=3, samples=None):
    """``steps`` lists of ``micro_batches`` (inputs, labels) pairs of ``samples``
    (default 12, or 8 with micro-batches: every rank's part of equal size)."""
    samples = samples or (12 if micro_batches == 1 else 8)
    X, y = hard_case_data(dtype=dtype)
    pairs = list(zip(X.split(samples), y.split(samples)))
    return [pairs[i * micro_batches : (i + 1) * micro_batches] for i in range(steps)]


def counted_mlp():
    """An MLP 6 -> 8 -> 8 -> 3 in float64: three units, rows 8, 8, 3."""
    torch.manual_seed(0)
    return zero.make_mlp((6, 8, 8, 3))
