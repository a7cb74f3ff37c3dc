"""Bus bandwidth of hand-written naive and ring all-reduce against dist.all_reduce.

    python bench/allreduce.py                       # 1, 16, 64 MiB on 2 and 4 ranks
    python bench/allreduce.py --sizes-mib 1 4 --world-sizes 2 --repeats 3

One run prints one table: for each world size and float32 tensor size, the bus
bandwidth (nccl-tests' busbw = size / time · 2(n-1)/n) of multigpu.collectives'
naive all-reduce, textbook ring and pipelined ring, and of
torch.distributed.all_reduce (gloo on CPU, nccl on GPUs), then the ratio pipelined
ring / dist.all_reduce (above 1: the hand-written ring is faster). Each time is the
fastest of the repeats, each timed on the slowest rank; the methods take turns in
every repeat, and small tensors get more repeats (up to 8x). Taught in
notebooks/07_collectives_from_scratch.ipynb.
"""

from __future__ import annotations

import argparse
import sys
import time

from multigpu.ranks.collectives import time_all_reduces_rank
from multigpu.runtime.launch import spawn

MiB = 2**20
NAMES = ("naive", "ring", "ring pipelined", "dist.all_reduce")


def repeats_for(nbytes: int, repeats: int) -> int:
    """More repeats for small tensors, whose times are short and noisy."""
    return max(repeats, min(8 * repeats, repeats * 16 * MiB // nbytes))


def run(world_sizes: list[int], sizes_mib: list[int], repeats: int) -> list[dict]:
    """One row per (world size, size) with the four bus bandwidths in GB/s."""
    table = []
    for world_size in world_sizes:
        for nbytes in [size * MiB for size in sizes_mib]:
            rows = spawn(
                time_all_reduces_rank,
                world_size,
                [nbytes],
                repeats_for(nbytes, repeats),
                NAMES,
                timeout=300.0,
            )[0]  # every rank holds the same (slowest-rank) times
            busbw = {row["algorithm"]: row["busbw GB/s"] for row in rows}
            ratio = busbw["ring pipelined"] / busbw["dist.all_reduce"]
            table.append(
                {
                    "world_size": world_size,
                    "MiB": nbytes // MiB,
                    **busbw,
                    "pipelined / dist": ratio,
                }
            )
    return table


def print_table(table: list[dict]) -> None:
    header = (
        f"{'ranks':>5} {'MiB':>5} {'naive GB/s':>11} {'ring GB/s':>10} "
        f"{'pipelined GB/s':>15} {'dist GB/s':>10} {'pipelined/dist':>15}"
    )
    print(header)
    print("-" * len(header))
    for row in table:
        print(
            f"{row['world_size']:>5} {row['MiB']:>5} {row['naive']:>11.3f} "
            f"{row['ring']:>10.3f} {row['ring pipelined']:>15.3f} "
            f"{row['dist.all_reduce']:>10.3f} {row['pipelined / dist']:>15.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--world-sizes", type=int, nargs="+", default=[2, 4], help="default: 2 4"
    )
    parser.add_argument(
        "--sizes-mib", type=int, nargs="+", default=[1, 16, 64], help="default: 1 16 64"
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="fewest repeats per size (default: 7)"
    )
    options = parser.parse_args(argv)
    start = time.perf_counter()
    table = run(options.world_sizes, options.sizes_mib, options.repeats)
    print_table(table)
    print(
        f"busbw = size / time * 2(n-1)/n; fastest of >= {options.repeats} repeats; "
        f"{time.perf_counter() - start:.0f} s in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
