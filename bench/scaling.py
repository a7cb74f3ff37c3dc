"""Notebook 12's cost model against this machine, repeated: for 2, 3 and 4 ranks,
fit α and B to ``dist.all_reduce`` times, predict DDP's step from the step without
its all-reduce, and print the prediction over the measured step (12). Run:

    python bench/scaling.py                   # 3 repeats of 2, 3 and 4 ranks
    python bench/scaling.py 1 --world-sizes 2
"""

from __future__ import annotations

import argparse
import sys

from multigpu import costmodel
from multigpu.core.models import mlp
from multigpu.ranks.scaling import scaling_measurements_rank
from multigpu.runtime.launch import spawn

SIZES = [4 << 10, 1 << 20, 4 << 20, 16 << 20]  # bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "repeats", type=int, nargs="?", default=3, help="rounds (default: 3)"
    )
    parser.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=[2, 3, 4],
        help="ranks measured in each round (default: 2 3 4)",
    )
    options = parser.parse_args(argv)
    model = mlp(64, 256, 6)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"mlp(64, 256, 6): {4 * parameters / 1e6:.2f} MB of gradients, 32 per rank")
    print("ranks | α µs | B GB/s | measured ms | predicted ms | predicted/measured")
    ratios = []
    for _ in range(options.repeats):
        for n in options.world_sizes:
            m = spawn(scaling_measurements_rank, n, SIZES, model, (64,), 32, 20, 5)
            alpha, bandwidth = costmodel.fit_alpha_beta(m[0]["all_reduce"])
            step = m[0]["step"]
            work = costmodel.Workload("mlp", parameters, step["no_sync"], batch=32)
            link = costmodel.Link("gloo", bandwidth, alpha)
            predicted = costmodel.ddp_step(work, n, link, int(step["buckets"])).total
            ratios.append(predicted / step["synced"])
            print(
                f"{n:5} | {1e6 * alpha:4.0f} | {bandwidth / 1e9:6.2f} | "
                f"{1e3 * step['synced']:11.2f} | {1e3 * predicted:12.2f} | "
                f"{ratios[-1]:.2f}"
            )
    print(f"predicted/measured: {min(ratios):.2f} to {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
