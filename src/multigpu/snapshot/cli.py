"""The options of notebook 11's torchrun script, ``python -m multigpu.snapshot``,
and their checks (:func:`configure`): those both scripts take
(:func:`multigpu.ddp.cli.script_parser`), and the snapshot folder, how often to
snapshot and the fault to inject (11). Like the DDP script's, a wrong option stops
it before its process group starts, in one line; so does an option of the DDP
script's loop, which this one does not have.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from multigpu.core.checks import check_number, check_positive_int
from multigpu.ddp.cli import check_script_args, refuse, script_parser
from multigpu.ddp.configure import Run, prepare
from multigpu.ddp.script_checks import check_writable
from multigpu.snapshot.loop import snapshot_epoch_steps

MODULE = "multigpu.snapshot"  # this script: torchrun ... -m multigpu.snapshot
# The command that the error for a start without torchrun gives.
EXAMPLE = f"torchrun --standalone --nproc-per-node=2 -m {MODULE} --snapshot DIR"
SNAPSHOT_EVERY = 5  # --snapshot-every's default: a snapshot every 5 steps
MAX_STEP_DELAY_S = 60.0  # --step-delay: time to kill a rank, not to sleep for days
# The DDP script's own options, which this one refuses naming that script.
DDP_OPTIONS = {
    option: "is an option of notebook 09's script only: the snapshot loop keeps to "
    "plain SGD with momentum, saves in its folder and shows no progress bar. Leave "
    f"{option} out, or run -m multigpu.ddp, which does not snapshot."
    for option in (
        "--checkpoint",
        "--resume",
        "--no-resume",
        "--accumulation",
        "--amp",
        "--no-amp",
        "--lr-scaling",
        "--progress",
        "--no-progress",
    )
}


def configure(argv: list[str] | None = None) -> Run:
    """The options, checked against the run before the process group starts
    (:func:`~multigpu.ddp.configure.prepare`): any that does not fit, a fault that
    would never fire included, stops the script in one line (11)."""
    args = parse_args(argv)
    run = prepare(args, argv, MODULE, snapshot_epoch_steps, EXAMPLE)
    check_fault(args, run.env.world_size, run.epoch_steps)
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The snapshot script's options: the shared ones and its own (11)."""
    parser = script_parser(
        MODULE,
        "Train ConvNet on the digits with DDP, snapshotting into a folder and "
        "resuming from it, under torchrun's restarts.",
        DDP_OPTIONS,
    )
    parser.add_argument(
        "--snapshot",
        required=True,
        metavar="DIR",
        help="folder for snapshots: rank 0 writes DIR/snapshot.pt every "
        "--snapshot-every steps, and every rank resumes from it at start",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=SNAPSHOT_EVERY,
        metavar="K",
        help=f"a snapshot every K steps (default {SNAPSHOT_EVERY})",
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
        help="sleep after every step, to leave time to kill a rank from outside",
    )
    args = parser.parse_args(argv)
    check_script_args(parser, args)
    try:
        _check_values(args)
    except ValueError as error:
        parser.error(str(error))
    if (args.kill_rank is None) != (args.kill_at_step is None):
        parser.error(
            "--kill-rank and --kill-at-step go together: pass both (which rank "
            "dies, before which step) or neither."
        )
    return args


def _check_values(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` with the fix for the first option out of its range."""
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
    check_positive_int(
        "--snapshot-every",
        args.snapshot_every,
        "Pass the number of steps between snapshots, e.g. 5.",
    )
    check_writable("--snapshot", args.snapshot, Path(args.snapshot).absolute())


def check_fault(args: argparse.Namespace, world_size: int, epoch_steps: int) -> None:
    """Stop the script (one line, exit status 2) if the fault to inject would never
    fire: ``--kill-rank`` is not a rank of the ``world_size`` torchrun started, or
    ``--kill-at-step`` is past the run's ``epochs × epoch_steps`` steps (11)."""
    if args.kill_rank is not None and args.kill_rank >= world_size:
        refuse(
            f"--kill-rank {args.kill_rank} is not a rank of this run: torchrun "
            f"started {world_size} (0 to {world_size - 1}). Pass a rank from 0 to "
            f"{world_size - 1}, or start more ranks.",
            MODULE,
        )
    total = args.epochs * epoch_steps
    if args.kill_at_step is not None and args.kill_at_step >= total:
        refuse(
            f"--kill-at-step {args.kill_at_step} never comes: this run trains "
            f"{total} steps ({args.epochs} epochs of {epoch_steps}), so the fault "
            f"would not fire. Pass a step from 0 to {total - 1}.",
            MODULE,
        )
