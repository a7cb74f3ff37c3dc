"""Entry point: ``torchrun --standalone --nproc-per-node=2 -m
multigpu.ranks.torchrun_example [ddp-exit [return|exit_rank]]``."""

import sys

from multigpu.ranks.torchrun_example import ddp_exit_demo, print_sum_of_ranks
from multigpu.runtime.launch import exit_rank


def main() -> None:
    """Every rank prints (rank 0) and ends with exit_rank, unless told ``return``."""
    if sys.argv[1:2] == ["ddp-exit"]:
        ending = sys.argv[2] if len(sys.argv) > 2 else "exit_rank"
        ddp_exit_demo()
        if ending == "exit_rank":
            exit_rank(0)
    else:
        print_sum_of_ranks()
        exit_rank(0)


if __name__ == "__main__":
    main()
