"""The options of the 4-D torchrun script, and the checks that stop it (19).

Nothing here imports torch: a grid that cannot work (a product that is not the
number of ranks, heads not divisible by tp, layers by pp, the sequence by cp, a
batch too small for dp and the micro-batches) stops every rank with one line from
rank 0 (``prog: error: <what is wrong>; <how to fix it>``, exit status 2) in a
fraction of a second, before torch is imported or a process group starts, as
09's script does (:mod:`multigpu.ddp.cli`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from multigpu.gpt4d.config import GPTConfig
from multigpu.gpt4d.grid import Grid, grid_problem
from multigpu.runtime.quiet_ranks import exit_quietly

__all__ = ["PROG", "ScriptOptions", "parse_args", "script_parser"]

PROG = "torchrun --nproc-per-node=N -m multigpu.gpt4d"


class _OneLineParser(argparse.ArgumentParser):
    """Errors are one line, from rank 0 only (every rank parses the same)."""

    def error(self, message: str) -> NoReturn:
        if os.environ.get("RANK", "0") == "0":
            self.exit(2, f"{self.prog}: error: {message}\n")
        exit_quietly()  # rank 0 prints the line first


def script_parser() -> argparse.ArgumentParser:
    """The script's options: the grid, the model's shape, the training (19)."""
    parser = _OneLineParser(
        prog=PROG,
        description="Train the tiny GPT on a dp x tp x pp x cp grid of ranks.",
    )
    for dim, words in (
        ("dp", "data-parallel replicas"),
        ("tp", "tensor-parallel ranks (divides heads)"),
        ("pp", "pipeline stages (divides layers)"),
        ("cp", "context-parallel ranks (divides seq-len)"),
    ):
        parser.add_argument(f"--{dim}", type=int, default=1, help=words)
    defaults = GPTConfig()
    for field in ("vocab", "seq_len", "dim", "heads", "layers", "mlp_ratio"):
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(defaults, field))
    parser.add_argument("--batch", type=int, default=6, help="global batch (sequences)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--float64", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare every rank's weights with one process at the end",
    )
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS")
    return parser


class ScriptOptions(argparse.Namespace):
    """The parsed options, plus ``grid``, ``config`` and ``world_size`` (19)."""

    grid: Grid
    config: GPTConfig
    world_size: int


def parse_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> Any:
    """Parse and check the options against the number of ranks torchrun started
    (``WORLD_SIZE``); refuse an impossible grid in one line, exit status 2 (19)."""
    environ = os.environ if environ is None else environ
    parser = script_parser()
    args = parser.parse_args(argv, namespace=ScriptOptions())
    if "WORLD_SIZE" not in environ:
        parser.error(
            "WORLD_SIZE is not set: this is a torchrun script; start it with "
            "torchrun --nproc-per-node=N -m multigpu.gpt4d ..."
        )
    for name in (
        "vocab",
        "seq_len",
        "dim",
        "heads",
        "layers",
        "mlp_ratio",
        "batch",
        "steps",
        "microbatches",
    ):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is {getattr(args, name)}; give 1 or more.")
    if args.dim % args.heads:
        parser.error(
            f"--dim {args.dim} is not divisible by --heads {args.heads}; "
            "choose a dim that is a multiple of heads."
        )
    if args.timeout <= 0:
        parser.error(
            f"--timeout is {args.timeout:g}; give a number of seconds above 0."
        )
    args.world_size = int(environ["WORLD_SIZE"])
    args.grid = Grid(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp)
    fields = ("vocab", "seq_len", "dim", "heads", "layers", "mlp_ratio")
    args.config = GPTConfig(**{f: getattr(args, f) for f in fields})
    problem = grid_problem(
        args.grid, args.world_size, args.config, args.batch, args.microbatches
    )
    if problem:
        parser.error(problem)
    return args
