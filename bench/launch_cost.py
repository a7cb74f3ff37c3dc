"""What a launch of ranks costs in CPU time, with and without torch._dynamo among
what spawn's forkserver imports before it forks the ranks.

    python bench/launch_cost.py                  # 1, 2 and 4 ranks, 5 launches each
    python bench/launch_cost.py --launches 10 --ranks 2

Each rank builds a small model and an SGD optimizer and takes one step with its
gradients all-reduced, then reports the CPU-seconds it used since it was forked
(``bench.ranks.one_training_step_rank``; POSIX). The first ``torch.optim.Optimizer``
of a process imports torch._dynamo (``torch/optim/optimizer.py``: ``add_param_group``
is wrapped by ``torch._disable_dynamo``, ``torch/_compile.py``), so a rank forked
from a server that has not imported it pays that import itself. Each preload runs in
a new Python process of its own, since a forkserver is started once per process.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from multigpu.runtime.launch import parent, spawn

ROOT = Path(__file__).resolve().parents[1]  # the repository, home of bench.ranks
WITHOUT_DYNAMO = [name for name in parent.FORKSERVER_PRELOAD if name != "torch._dynamo"]
PRELOADS = {
    "spawn's preload": parent.FORKSERVER_PRELOAD,
    "without torch._dynamo": WITHOUT_DYNAMO,
}


def measure(preload: list[str], ranks: list[int], launches: int) -> dict[int, float]:
    """{world size: median CPU-seconds of one launch, summed over its ranks}; in
    this process, whose forkserver must not have started yet."""
    sys.path.insert(0, str(ROOT))  # the ranks inherit it: they import bench.ranks
    from bench.ranks import one_training_step_rank

    parent.FORKSERVER_PRELOAD = preload
    spawn(one_training_step_rank, 1)  # starts the forkserver, not counted
    return {
        world_size: statistics.median(
            sum(spawn(one_training_step_rank, world_size)) for _ in range(launches)
        )
        for world_size in ranks
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--launches", type=int, default=5, help="launches per size (default: 5)"
    )
    parser.add_argument(
        "--ranks", type=int, nargs="+", default=[1, 2, 4], help="world sizes"
    )
    parser.add_argument("--preload", help=argparse.SUPPRESS)  # one row, as JSON
    args = parser.parse_args(argv)
    if args.preload is not None:
        print(json.dumps(measure(args.preload.split(","), args.ranks, args.launches)))
        return 0
    print(f"{platform.platform()}, {args.launches} launches per size (median)")
    print(f"{'forkserver imports':<24}" + "".join(f"{n:>4} ranks" for n in args.ranks))
    for name, preload in PRELOADS.items():
        command = [sys.executable, __file__, "--preload", ",".join(preload)]
        command += ["--launches", str(args.launches), "--ranks"]
        command += [str(n) for n in args.ranks]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        seconds = json.loads(out.stdout.strip().splitlines()[-1])
        cells = "".join(f"{seconds[str(n)]:>8.2f} s" for n in args.ranks)
        print(f"{name:<24}{cells}")
    print("CPU-seconds of one launch, all its ranks together, fork to one step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
