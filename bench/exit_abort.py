"""How often does a torchrun rank that built a DDP model abort as it exits?

    python bench/exit_abort.py               # 20 launches of 4 ranks per ending
    python bench/exit_abort.py --runs 40 --ranks 2

Each launch runs ``torchrun -m multigpu.ranks.torchrun_example ddp-exit ENDING``: every
rank builds a ``DistributedDataParallel``, trains one step, all-gathers a tensor and
calls ``dist.destroy_process_group()``. With ``return`` the script then ends as most
scripts do, through Python's shutdown; with ``exit_rank`` it calls
:func:`multigpu.runtime.launch.exit_rank`. The table counts the launches torchrun
reported as failed, and those whose output holds the C++ runtime's "terminate called"
message (see ``exit_rank``'s docstring for the chain of causes). The aborts are a race,
so their count changes from run to run and with the machine's load; the ``exit_rank``
row must stay at 0.
"""

from __future__ import annotations

import argparse
import platform
import sys

from tqdm import tqdm

from multigpu.runtime.launch import run_torchrun

ENDINGS = ("return", "exit_rank")


def count_aborts(ending: str, runs: int, ranks: int) -> tuple[int, int]:
    """(failed launches, launches whose output says "terminate called")."""
    failed = aborted = 0
    for _ in tqdm(range(runs), desc=ending, leave=False):
        result = run_torchrun(
            "multigpu.ranks.torchrun_example",
            ranks,
            "ddp-exit",
            ending,
            check=False,
        )
        failed += result.returncode != 0
        aborted += "terminate called" in result.stdout + result.stderr
    return failed, aborted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=20, help="launches per ending (default: 20)"
    )
    parser.add_argument(
        "--ranks", type=int, default=4, help="ranks per launch (default: 4)"
    )
    args = parser.parse_args(argv)
    print(f"{platform.platform()}, {args.ranks} ranks, {args.runs} launches each")
    print(f"{'ending':<10} {'failed':>7} {'terminate called':>17}")
    for ending in ENDINGS:
        failed, aborted = count_aborts(ending, args.runs, args.ranks)
        print(f"{ending:<10} {failed:>7} {aborted:>17}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
