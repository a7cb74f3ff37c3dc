"""Step time of one process vs DistributedDataParallel at 2 and 4 ranks (09).

Each rank trains ConvNet on 32 digits-sized images per step (the per-rank batch is
fixed, so the global batch grows with the ranks). A step is timed with DDP's
gradient all-reduce and, in turns, without it (inside ``no_sync``); the difference
is the part of a step spent communicating. The first row is one plain process
(no DDP, no process group) doing the same step. Every rank gets one thread. Run:

    python bench/ddp_steps.py                 # 32 per rank, 30 steps, 1, 2 and 4 ranks
    python bench/ddp_steps.py --batch 64 --steps 10 --world-sizes 1 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

from multigpu.core.models import ConvNet
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import spawn


def plain_step_seconds(per_rank_batch: int = 32, steps: int = 30) -> float:
    """Median seconds of the same step in this process, without DDP, on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = ConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        X = torch.randn(per_rank_batch, 1, 8, 8)
        y = torch.randint(0, 10, (per_rank_batch,))
        seconds = []
        for step in range(steps + 1):
            start = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(X), y).backward()
            optimizer.step()
            if step:  # step 0 warms up
                seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch", type=int, default=32, help="samples per rank per step (default: 32)"
    )
    parser.add_argument(
        "--steps", type=int, default=30, help="timed steps (default: 30)"
    )
    parser.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="ranks of the DDP rows (default: 1 2 4)",
    )
    options = parser.parse_args(argv)
    batch, steps = options.batch, options.steps
    cores = os.cpu_count()
    print(
        f"ConvNet, {batch} samples per rank per step, 1 thread per rank, {cores} cores"
    )
    header = ("ranks", "step ms", "no-sync ms", "communication", "samples/s")
    widths = (10, *map(len, header[1:]))
    print(" | ".join(f"{name:>{width}}" for name, width in zip(header, widths)))
    plain = plain_step_seconds(batch, steps)
    print(
        f"{'1 (no DDP)':>10} | {1000 * plain:7.2f} | {'-':>10} | {'-':>13} | "
        f"{batch / plain:9.0f}"
    )
    for world_size in options.world_sizes:
        times = spawn(ddp_ranks.step_times_rank, world_size, batch, steps)[0]
        step, local = times["synced"], times["no_sync"]
        share = max(0.0, (step - local) / step)
        rate = batch * world_size / step
        print(
            f"{world_size:>10} | {1000 * step:7.2f} | {1000 * local:10.2f} | "
            f"{share:13.0%} | {rate:9.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
