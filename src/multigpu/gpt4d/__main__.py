"""The 4-D torchrun script (19)::

    torchrun --standalone --nproc-per-node=2 -m multigpu.gpt4d --pp 2 --steps 2

Every rank trains its part of the tiny GPT on a dp x tp x pp x cp grid (the
product is the number of ranks, here 2 pipeline stages); the rank that holds the
loss prints one line per step, and with ``--check`` (the default) rank 0 prints
whether every rank's weights equal one process's. gloo on CPU; on a node with GPUs
(``--backend auto``) nccl, one GPU per rank, the code unchanged: raise
``--nproc-per-node`` and the grid's sizes together. An impossible grid stops every
rank with one line and exit status 2 before torch is imported::

    torchrun --standalone --nproc-per-node=2 -m multigpu.gpt4d --dp 2 --tp 3

``--help``: the options.
"""

from __future__ import annotations

import sys

from multigpu.gpt4d.cli import parse_args


def main(argv: list[str] | None = None) -> int:
    """Check the options, then train (:func:`multigpu.gpt4d.script.run`) (19)."""
    args = parse_args(argv)
    from multigpu.gpt4d.script import run  # torch: only for a grid that can work

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
