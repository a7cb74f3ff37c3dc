"""The options of the course's torchrun scripts, and the checks that stop them (09).

:func:`script_parser` holds the options both scripts take; :func:`parse_args` adds
the DDP script's own (``python -m multigpu.ddp``); notebook 11's script
(``python -m multigpu.snapshot``) adds its own in ``multigpu/snapshot/cli.py``. A
wrong option stops a script before its process group starts, with one line
(``prog: error: ...``, exit status 2) from rank 0 only: the parser checks what the
options alone decide, :func:`check_run` what needs the number of ranks and samples,
:func:`check_restarts` what torchrun's restarts need (11), :func:`check_backend`
what the node's GPUs allow. An option that only another one gives a meaning to
(``--resume`` without ``--checkpoint``) is refused, not ignored; so is the other
script's option, naming that script.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from multigpu.core.batches import per_rank_batch_size
from multigpu.core.checks import check_number, check_positive_int
from multigpu.core.train import TrainConfig
from multigpu.ddp.accumulation import LR_SCALINGS
from multigpu.ddp.script_checks import TIMEOUT_RANGE_S, backend_problem, check_writable
from multigpu.runtime.quiet_ranks import exit_quietly

# torchrun's agent reads it before it starts the ranks: with "1", every round of
# ranks gets a TCP store of its own instead of sharing the rendezvous' (11).
OWN_STORE_VARIABLE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
DEFAULT_TIMEOUT_S = 60.0  # a hung rank is noticed in a minute, not gloo's 30
MODULE = "multigpu.ddp"  # this script: torchrun ... -m multigpu.ddp


def script_prog(module: str = MODULE) -> str:
    """How a script's errors name it: its torchrun command (09)."""
    return f"torchrun --standalone --nproc-per-node=N -m {module}"


PROG = script_prog()
# Notebook 11's script's own options, which this one refuses naming that script.
SNAPSHOT_OPTIONS = {
    option: f"is an option of notebook 11's script, which snapshots: pass it to "
    f"-m multigpu.snapshot instead of -m {MODULE}."
    for option in (
        "--snapshot",
        "--snapshot-every",
        "--kill-rank",
        "--kill-at-step",
        "--step-delay",
    )
}


class ScriptParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: ...``,
    exit status 2, no usage), printed by rank 0 of torchrun's first launch only:
    every rank parses the same options, so the others exit quietly (11).
    ``elsewhere`` maps another script's options to why they are refused here."""

    def __init__(
        self, *args: Any, elsewhere: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.elsewhere = dict(elsewhere or {})

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        for word in unknown:
            option = word.split("=", 1)[0]
            if option in self.elsewhere:
                self.error(f"{option} {self.elsewhere[option]}")
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        if speaks_for_the_run():
            self.exit(2, f"{self.prog}: error: {message}\n")
        if not speaks_for_the_run({**os.environ, "RANK": "0"}):
            self.exit(2)  # a restart: rank 0 is quiet too
        exit_quietly()  # rank 0 prints the line first


def speaks_for_the_run(environ: Mapping[str, str] | None = None) -> bool:
    """True outside torchrun, and on rank 0 of the first launch under it (11)."""
    environ = os.environ if environ is None else environ
    first_launch = environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return environ.get("RANK", "0") == "0" and first_launch


def refuse(message: str, module: str = MODULE) -> NoReturn:
    """Stop the script as :class:`ScriptParser` does: one line, exit status 2."""
    ScriptParser(prog=script_prog(module)).error(message)


def script_parser(
    module: str, description: str, elsewhere: Mapping[str, str]
) -> ScriptParser:
    """A parser with the options both torchrun scripts take (09, 11);
    ``elsewhere``: the other script's options, each with why it is refused here.
    Switches use ``BooleanOptionalAction`` (``--float64`` / ``--no-float64``),
    never ``type=bool``: ``bool("False")`` is True (09b)."""
    defaults = TrainConfig()
    parser = ScriptParser(
        prog=script_prog(module), description=description, elsewhere=elsewhere
    )
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="global batch"
    )
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--momentum", type=float, default=defaults.momentum)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--sync-bn",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="ConvNet with BatchNorm, synchronized over the ranks",
    )
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="a collective that waits longer for a peer (a hung rank) fails; "
        f"default {DEFAULT_TIMEOUT_S:g} s (gloo's own is 30 minutes)",
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
    return parser


def check_script_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    """Stop the script (one line, exit status 2) at the first of
    :func:`script_parser`'s options out of its range, with the fix (09, 11)."""
    try:
        _check_values(args)
    except ValueError as error:
        parser.error(str(error))
    if args.samples is not None:
        _check_positive_option(
            parser,
            "--samples",
            args.samples,
            "Pass how many training digits to use, or leave --samples out for all.",
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The DDP script's options: :func:`script_parser`'s and its loop's (09, 09b)."""
    parser = script_parser(
        MODULE,
        "Train ConvNet on the digits with DistributedDataParallel.",
        SNAPSHOT_OPTIONS,
    )
    parser.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="autocast: bfloat16 on CPU, float16 with a GradScaler on GPU",
    )
    parser.add_argument("--checkpoint", default=None, help="file rank 0 saves to")
    parser.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True
    )
    args = parser.parse_args(argv)
    check_script_args(parser, args)
    try:
        check_positive_int(
            "--accumulation", args.accumulation, "Pass 1 for no accumulation."
        )
        if args.checkpoint is not None:
            folder = Path(args.checkpoint).absolute().parent
            check_writable("--checkpoint", args.checkpoint, folder)
    except ValueError as error:
        parser.error(str(error))
    if args.resume and args.checkpoint is None:
        parser.error(
            "--resume needs --checkpoint FILE: the file it resumes from (and "
            "saves to after every epoch). Add --checkpoint FILE, or leave "
            "--resume out."
        )
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
    check_number(
        "--timeout", args.timeout, f"Pass e.g. --timeout {DEFAULT_TIMEOUT_S:g}."
    )
    low, high = TIMEOUT_RANGE_S
    if not low <= args.timeout <= high:
        raise ValueError(
            f"--timeout must be from {low:g} to {high:g} seconds (a week), got "
            f"{args.timeout:g}. Pass e.g. --timeout {DEFAULT_TIMEOUT_S:g}."
        )


def _check_positive_option(
    parser: argparse.ArgumentParser, option: str, value: int, how_to_fix: str
) -> None:
    """Stop the script with check_positive_int's message unless ``value`` is 1 or
    more (11)."""
    try:
        check_positive_int(option, value, how_to_fix)
    except ValueError as error:
        parser.error(str(error))


def check_run(
    args: argparse.Namespace,
    world_size: int,
    num_samples: int,
    epoch_steps: int,
    module: str = MODULE,
) -> None:
    """Stop the script (one line, exit status 2) if the options do not fit this
    run: ``world_size`` ranks, ``num_samples`` training samples, ``epoch_steps``
    optimizer steps per epoch. Call it before the process group starts (11)."""
    try:
        per_rank_batch_size(args.batch_size, world_size)
    except ValueError as error:
        refuse(f"--batch-size {args.batch_size}: {error}", module)
    if epoch_steps == 0:
        what = (
            f"--samples {args.samples} gives {num_samples} samples"
            if args.samples is not None
            else f"the training set has {num_samples} samples"
        )
        refuse(
            f"{what}, fewer than one global batch (--batch-size {args.batch_size}) "
            f"on {world_size} ranks: no rank would train a single step. Pass more "
            "--samples or a smaller --batch-size.",
            module,
        )


def check_accumulation(args: argparse.Namespace, world_size: int) -> None:
    """Stop the DDP script (one line, exit status 2) unless ``--accumulation``
    splits each rank's share of the batch into equal micro-batches; after
    :func:`check_run` (09b)."""
    per_rank = per_rank_batch_size(args.batch_size, world_size)
    if per_rank % args.accumulation:
        refuse(
            f"--accumulation {args.accumulation} does not split a per-rank batch of "
            f"{per_rank} into equal micro-batches. Pass a --batch-size that is a "
            f"multiple of {world_size} ranks x {args.accumulation} = "
            f"{world_size * args.accumulation}, or another --accumulation."
        )


def check_restarts(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    module: str = MODULE,
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
        f"-m {module} {script}".rstrip(),
        module,
    )


def check_backend(
    backend: str, local_world_size: int, gpus: int, module: str = MODULE
) -> None:
    """Stop the script (one line, exit status 2) if ``--backend`` needs more GPUs
    than this node's ``gpus`` for its ``local_world_size`` ranks
    (:func:`~multigpu.ddp.script_checks.backend_problem`) (09)."""
    problem = backend_problem(backend, local_world_size, gpus)
    if problem is not None:
        refuse(problem, module)


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
