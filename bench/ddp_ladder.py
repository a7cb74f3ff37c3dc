"""The ladder of notebook 10 against PyTorch's DDP: step time and hidden
communication, at 2 and 4 ranks, and a bucket-size sweep.

The model is ``multigpu.core.models.mlp(width=1024, depth=6)``: 5.3 million float32
parameters, 20 MiB of gradients per step, in 7 layers of nearly equal size, so
communication matters on a CPU and backward produces gradients at an even pace.
Each rank gets 64 random samples per step and one thread. The variants take turns,
step by step, so that a busy moment of the machine hits all of them; the slowest
rank's time counts and the median over the steps is printed. "hidden" is the
median fraction of all-reduce time that ran while backward was still computing
(from the wrappers' own timelines; PyTorch's DDP keeps none). Run:

    python bench/ddp_ladder.py                      # 15 steps; 2 and 4 ranks
    python bench/ddp_ladder.py --steps 5 --world-sizes 2
"""

from __future__ import annotations

import argparse
import os
import sys

from multigpu.core.models import count_parameters, mlp
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import spawn

LADDER = [
    ("after_backward", "after_backward", {}),
    ("flat", "flat", {}),
    ("bucketed 5 MB", "bucketed", {"bucket_cap_mb": 5}),
    ("torch DDP 5 MB", "torch", {"bucket_cap_mb": 5}),
]
SWEEP = [
    (f"{name} {mb} MB", strategy, {"bucket_cap_mb": mb})
    for mb in (1, 5, 25)
    for name, strategy in (("bucketed", "bucketed"), ("torch DDP", "torch"))
]


def table(world_size: int, variants: list, steps: int) -> dict:
    model = mlp(in_features=64, width=1024, depth=6)
    times = spawn(
        miniddp_ranks.step_time_rank,
        world_size,
        model,
        64,
        (64,),
        variants,
        steps,
        timeout=120,
        deadline=900,
    )[0]
    print(f"{'variant':>18} | step ms | hidden")
    for label, result in times.items():
        hidden = result["hidden"]
        shown = "   -" if hidden != hidden else f"{hidden:6.0%}"
        print(f"{label:>18} | {1000 * result['seconds']:7.1f} | {shown}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=15, help="timed steps per variant (default: 15)"
    )
    parser.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=[2, 4],
        help="ranks of the ladder (default: 2 4); the bucket sweep runs on 2",
    )
    options = parser.parse_args(argv)
    params = count_parameters(mlp(in_features=64, width=1024, depth=6))
    print(
        f"mlp(width=1024, depth=6): {params:,} parameters, {4 * params / 2**20:.1f} "
        f"MiB of gradients; 64 samples per rank, 1 thread per rank, "
        f"{os.cpu_count()} cores"
    )
    for world_size in options.world_sizes:
        print(f"\n== {world_size} ranks: the ladder")
        times = table(world_size, LADDER, options.steps)
        ratio = times["bucketed 5 MB"]["seconds"] / times["torch DDP 5 MB"]["seconds"]
        print(f"bucketed / torch DDP step time: {ratio:.2f}x (target: at most 1.10x)")
    print("\n== 2 ranks: bucket size (bucket_cap_mb)")
    table(2, SWEEP, options.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
