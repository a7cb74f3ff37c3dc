"""Step time of one process vs DistributedDataParallel at 2 and 4 ranks (09).

Each rank trains ConvNet on 32 digits-sized images per step (the per-rank batch is
fixed, so the global batch grows with the ranks). A step is timed with DDP's
gradient all-reduce and, in turns, without it (inside ``no_sync``); the difference
is the part of a step spent communicating. Every rank gets one thread. Run:

    python bench/ddp.py
"""

from __future__ import annotations

import os

from multigpu import ddp
from multigpu.launch import spawn


def main() -> None:
    cores = os.cpu_count()
    print(f"ConvNet, 32 samples per rank per step, 1 thread per rank, {cores} cores")
    header = ("ranks", "step ms", "no-sync ms", "communication", "samples/s")
    print(" | ".join(f"{name:>{len(name)}}" for name in header))
    for world_size in (1, 2, 4):
        times = spawn(ddp.step_times, world_size, 32, 30)[0]
        step, local = times["synced"], times["no_sync"]
        share = max(0.0, (step - local) / step)
        rate = 32 * world_size / step
        print(
            f"{world_size:>5} | {1000 * step:7.2f} | {1000 * local:10.2f} | "
            f"{share:13.0%} | {rate:9.0f}"
        )


if __name__ == "__main__":
    main()
