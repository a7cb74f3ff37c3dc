"""The script's options and its model; the script itself is ``__main__.py`` (09)."""

from __future__ import annotations

import argparse

import torch
from torch import nn

from multigpu.core.checks import check_positive_int
from multigpu.core.train import TrainConfig
from multigpu.ddp.accumulation import LR_SCALINGS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options. Switches use ``BooleanOptionalAction`` (``--amp`` /
    ``--no-amp``), never ``type=bool``: ``bool("False")`` is True (09b)."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        prog="torchrun --standalone --nproc-per-node=N -m multigpu.ddp",
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
    # Notebook 11: snapshots, restarts and injected faults (multigpu.snapshot).
    parser.add_argument(
        "--snapshot",
        default=None,
        metavar="DIR",
        help="folder for snapshots: rank 0 writes DIR/snapshot.pt every "
        "--snapshot-every steps, and every rank resumes from it at start",
    )
    parser.add_argument("--snapshot-every", type=int, default=5, metavar="K")
    parser.add_argument(
        "--kill-rank",
        type=int,
        default=None,
        metavar="R",
        help="fault injection: rank R kills itself with SIGKILL, once",
    )
    parser.add_argument(
        "--kill-at-step", type=int, default=None, metavar="S", help="... before step S"
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep after every step, to leave time to kill a rank from outside",
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
    _check_snapshot_args(parser, args)
    return args


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
    if args.snapshot is not None:
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
