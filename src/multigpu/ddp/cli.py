"""The script's options and its model; the script itself is ``__main__.py`` (09).

A wrong option stops the script before its process group starts, with one line
(``error: ...``, exit status 2) from rank 0 only: :func:`parse_args` checks what the
options alone decide, :func:`check_run` what needs the number of ranks and samples,
:func:`check_restarts` what torchrun's restarts need (11), :func:`check_backend`
what the node's GPUs allow. An option that only another one gives a meaning to
(``--step-delay`` without ``--snapshot``) is refused, not ignored.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn

from multigpu.core.checks import check_number, check_positive_int
from multigpu.core.sharding import per_rank_batch_size
from multigpu.core.train import TrainConfig
from multigpu.ddp.accumulation import LR_SCALINGS
from multigpu.ddp.script_checks import (
    MAX_STEP_DELAY_S,
    TIMEOUT_RANGE_S,
    backend_problem,
    check_writable,
)

# torchrun's agent reads it before it starts the ranks: with "1", every round of
# ranks gets a TCP store of its own instead of sharing the rendezvous' (11).
OWN_STORE_VARIABLE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
DEFAULT_TIMEOUT_S = 60.0  # a hung rank is noticed in a minute, not gloo's 30
PROG = "torchrun --standalone --nproc-per-node=N -m multigpu.ddp"
SNAPSHOT_EVERY = 5  # --snapshot-every's default: a snapshot every 5 steps


class ScriptParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: ...``,
    exit status 2, no usage), printed by rank 0 of torchrun's first launch only:
    every rank parses the same options, so the others exit quietly (11)."""

    def error(self, message: str) -> NoReturn:
        if speaks_for_the_run():
            self.exit(2, f"{self.prog}: error: {message}\n")
        self.exit(2)


def speaks_for_the_run(environ: Mapping[str, str] | None = None) -> bool:
    """True outside torchrun, and on rank 0 of the first launch under it (11)."""
    environ = os.environ if environ is None else environ
    first_launch = environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return environ.get("RANK", "0") == "0" and first_launch


def refuse(message: str) -> NoReturn:
    """Stop the script as :class:`ScriptParser` does: one line, exit status 2."""
    ScriptParser(prog=PROG).error(message)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options. Switches use ``BooleanOptionalAction`` (``--amp`` /
    ``--no-amp``), never ``type=bool``: ``bool("False")`` is True (09b)."""
    defaults = TrainConfig()
    parser = ScriptParser(
        prog=PROG,
        description="Train ConvNet on the digits with DistributedDataParallel.",
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="global batch"
    )
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--momentum", type=float, default=defaults.momentum)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="autocast: bfloat16 on CPU, float16 with a GradScaler on GPU",
    )
    parser.add_argument(
        "--sync-bn",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="ConvNet with BatchNorm, synchronized over the ranks",
    )
    parser.add_argument("--checkpoint", default=None, help="file rank 0 saves to")
    parser.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="a collective that waits longer for a peer (a hung rank) fails; "
        f"default {DEFAULT_TIMEOUT_S:g} s (gloo's own is 30 minutes)",
    )
    # Notebook 11: snapshots, restarts and injected faults (multigpu.snapshot).
    parser.add_argument(
        "--snapshot",
        default=None,
        metavar="DIR",
        help="folder for snapshots: rank 0 writes DIR/snapshot.pt every "
        "--snapshot-every steps, and every rank resumes from it at start",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=None,
        metavar="K",
        help=f"with --snapshot: a snapshot every K steps (default {SNAPSHOT_EVERY})",
    )
    parser.add_argument(
        "--kill-rank",
        type=int,
        default=None,
        metavar="R",
        help="fault injection: rank R kills itself with SIGKILL, once",
    )
    parser.add_argument(
        "--kill-at-step",
        type=int,
        default=None,
        metavar="S",
        help="... after step S (S steps done; the first step is 1)",
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --snapshot: sleep after every step, to leave time to kill a "
        "rank from outside",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="N",
        help="train on the first N training digits only",
    )
    parser.add_argument(
        "--show-ranks",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="rank 0 prints what torchrun told every rank (RANK, LOCAL_RANK, ...)",
    )
    parser.add_argument(
        "--float64",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="model and data in float64",
    )
    args = parser.parse_args(argv)
    try:
        _check_values(args)
    except ValueError as error:
        parser.error(str(error))
    _check_snapshot_args(parser, args)
    return args


def _check_values(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` with the fix for the first option out of its range."""
    check_positive_int("--epochs", args.epochs, "Pass e.g. --epochs 5.")
    check_positive_int("--batch-size", args.batch_size, "Pass e.g. --batch-size 64.")
    check_number("--lr", args.lr, "Pass e.g. --lr 0.05.")
    check_number(
        "--momentum",
        args.momentum,
        "Pass e.g. --momentum 0.9, or 0 for none.",
        allow_zero=True,
    )
    if not 0 <= args.seed < 2**32:
        raise ValueError(
            f"--seed must be from 0 to 2**32 - 1 (NumPy's range), got {args.seed}. "
            "Pass e.g. --seed 0."
        )
    check_positive_int(
        "--accumulation", args.accumulation, "Pass 1 for no accumulation."
    )
    check_number(
        "--timeout", args.timeout, f"Pass e.g. --timeout {DEFAULT_TIMEOUT_S:g}."
    )
    low, high = TIMEOUT_RANGE_S
    if not low <= args.timeout <= high:
        raise ValueError(
            f"--timeout must be from {low:g} to {high:g} seconds (a week), got "
            f"{args.timeout:g}. Pass e.g. --timeout {DEFAULT_TIMEOUT_S:g}."
        )
    check_number("--step-delay", args.step_delay, "Pass 0 for none.", allow_zero=True)
    if args.step_delay > MAX_STEP_DELAY_S:
        raise ValueError(
            f"--step-delay must be from 0 to {MAX_STEP_DELAY_S:g} seconds, got "
            f"{args.step_delay:g}. Pass e.g. --step-delay 0.1."
        )
    for option, value, what in (
        ("--kill-rank", args.kill_rank, "the rank that dies, from 0"),
        ("--kill-at-step", args.kill_at_step, "the steps done before it dies"),
    ):
        if value is not None and value < 0:
            raise ValueError(
                f"{option} must be 0 or more, got {value}. Pass {what}, e.g. "
                f"{option} 1."
            )
    if args.checkpoint is not None:
        check_writable(
            "--checkpoint", args.checkpoint, Path(args.checkpoint).absolute().parent
        )
    if args.snapshot is not None:
        check_writable("--snapshot", args.snapshot, Path(args.snapshot).absolute())


def _check_snapshot_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    """Refuse option combinations the snapshot loop does not handle (11)."""
    if (args.kill_rank is None) != (args.kill_at_step is None):
        parser.error(
            "--kill-rank and --kill-at-step go together: pass both (which rank "
            "dies, before which step) or neither."
        )
    if args.kill_rank is not None and args.snapshot is None:
        parser.error(
            "--kill-rank needs --snapshot DIR: the folder records that the fault "
            "fired, so that it fires once. Add --snapshot DIR."
        )
    if args.snapshot is None:
        for option, used, what in (
            ("--step-delay", args.step_delay > 0, "slows the snapshot loop down"),
            (
                "--snapshot-every",
                args.snapshot_every is not None,
                "is how often the snapshot loop saves",
            ),
        ):
            if used:
                parser.error(
                    f"{option} needs --snapshot DIR: it {what}, which runs only with "
                    f"a snapshot folder. Add --snapshot DIR, or leave {option} out."
                )
        if args.resume and args.checkpoint is None:
            parser.error(
                "--resume needs --checkpoint FILE: the file it resumes from (and "
                "saves to after every epoch). Add --checkpoint FILE, or leave "
                "--resume out."
            )
    if args.snapshot is not None:
        if args.snapshot_every is None:
            args.snapshot_every = SNAPSHOT_EVERY
        unsupported = [
            name
            for name, used in (
                ("--checkpoint", args.checkpoint is not None),
                ("--resume", args.resume),
                ("--accumulation", args.accumulation != 1),
                ("--amp", args.amp),
                ("--lr-scaling linear", args.lr_scaling != "none"),
            )
            if used
        ]
        if unsupported:
            parser.error(
                f"--snapshot does not combine with {', '.join(unsupported)}: the "
                "snapshot loop (multigpu.snapshot) keeps to plain SGD with momentum. "
                "Leave these options out, or leave out --snapshot."
            )
        _check_positive_option(
            parser,
            "--snapshot-every",
            args.snapshot_every,
            "Pass the number of steps between snapshots, e.g. 5.",
        )
    if args.samples is not None:
        _check_positive_option(
            parser,
            "--samples",
            args.samples,
            "Pass how many training digits to use, or leave --samples out for all.",
        )


def _check_positive_option(
    parser: argparse.ArgumentParser, option: str, value: int, how_to_fix: str
) -> None:
    """Stop the script with the parser's usage and check_positive_int's message
    unless ``value`` is 1 or more (11)."""
    try:
        check_positive_int(option, value, how_to_fix)
    except ValueError as error:
        parser.error(str(error))


def check_run(
    args: argparse.Namespace, world_size: int, num_samples: int, epoch_steps: int
) -> None:
    """Stop the script (one line, exit status 2) if the options do not fit this
    run: ``world_size`` ranks, ``num_samples`` training samples, ``epoch_steps``
    optimizer steps per epoch. Call it before the process group starts (11)."""
    try:
        per_rank = per_rank_batch_size(args.batch_size, world_size)
    except ValueError as error:
        refuse(f"--batch-size {args.batch_size}: {error}")
    if per_rank % args.accumulation:
        refuse(
            f"--accumulation {args.accumulation} does not split a per-rank batch of "
            f"{per_rank} into equal micro-batches. Pass a --batch-size that is a "
            f"multiple of {world_size} ranks x {args.accumulation} = "
            f"{world_size * args.accumulation}, or another --accumulation."
        )
    if epoch_steps == 0:
        what = (
            f"--samples {args.samples} gives {num_samples} samples"
            if args.samples is not None
            else f"the training set has {num_samples} samples"
        )
        refuse(
            f"{what}, fewer than one global batch (--batch-size {args.batch_size}) "
            f"on {world_size} ranks: no rank would train a single step. Pass more "
            "--samples or a smaller --batch-size."
        )
    if args.kill_rank is not None and args.kill_rank >= world_size:
        refuse(
            f"--kill-rank {args.kill_rank} is not a rank of this run: torchrun "
            f"started {world_size} (0 to {world_size - 1}). Pass a rank from 0 to "
            f"{world_size - 1}, or start more ranks."
        )
    total = args.epochs * epoch_steps
    if args.kill_at_step is not None and args.kill_at_step >= total:
        refuse(
            f"--kill-at-step {args.kill_at_step} never comes: this run trains "
            f"{total} steps ({args.epochs} epochs of {epoch_steps}), so the fault "
            f"would not fire. Pass a step from 0 to {total - 1}."
        )


def check_restarts(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Stop the script (one line, exit status 2) under torchrun's restarts
    (``--max-restarts`` above 0) unless the shell set :data:`OWN_STORE_VARIABLE`:
    torchrun's agent reads it before it starts the ranks, so the script cannot set
    it for itself. Without it a restart on one machine hung or failed to connect
    ("Gloo connectFullMesh failed ... Connection refused") in most runs (11)."""
    environ = os.environ if environ is None else environ
    restarts = environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if restarts == "0" or environ.get(OWN_STORE_VARIABLE) == "1":
        return
    script = shlex.join(sys.argv[1:] if argv is None else argv)
    nodes = "--standalone --nproc-per-node=" + environ.get("LOCAL_WORLD_SIZE", "N")
    if environ.get("LOCAL_WORLD_SIZE") != environ.get("WORLD_SIZE"):
        nodes = "<your rendezvous options>"  # several nodes: the same on every one
    refuse(
        f"torchrun restarts need {OWN_STORE_VARIABLE}=1, which torchrun reads "
        "before it starts this script, so set it in the shell: "
        f"{OWN_STORE_VARIABLE}=1 torchrun {nodes} --max-restarts={restarts} "
        f"-m multigpu.ddp {script}".rstrip()
    )


def check_backend(backend: str, local_world_size: int, gpus: int) -> None:
    """Stop the script (one line, exit status 2) if ``--backend`` needs more GPUs
    than this node's ``gpus`` for its ``local_world_size`` ranks
    (:func:`~multigpu.ddp.script_checks.backend_problem`) (09)."""
    problem = backend_problem(backend, local_world_size, gpus)
    if problem is not None:
        refuse(problem)


def build_model(sync_bn: bool, device: torch.device) -> nn.Module:
    """ConvNet, with BatchNorm synchronized over the ranks if ``sync_bn``:
    ``nn.SyncBatchNorm`` on GPUs, the reference one on CPUs (09b)."""
    from multigpu.core.models import ConvNet

    model = ConvNet(batch_norm=sync_bn)
    if sync_bn:
        if device.type == "cuda":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            from multigpu.syncbn import convert_sync_batchnorm

            model = convert_sync_batchnorm(model)
    return model
