"""Notebook 11's torchrun script: DDP training that snapshots into a folder and
resumes from it, so that torchrun can restart its ranks when one dies (11)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 \\
        --max-restarts=3 -m multigpu.snapshot --snapshot DIR --snapshot-every 5 \\
        --kill-rank 1 --kill-at-step 13

Every rank runs :func:`~multigpu.snapshot.train_with_snapshots` on ConvNet and the
digits; rank 0 prints where it resumed, each snapshot and one line per epoch. It
takes the options of ``python -m multigpu.ddp`` that its loop has (``--help``), and
its own: ``--snapshot DIR`` (required), ``--snapshot-every K`` (default 5), and the
fault ``--kill-rank R --kill-at-step S``. Under torchrun's restarts it needs
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which torchrun reads before it starts the
ranks, so it goes in the shell (the script refuses to start without it, giving this
command).

Errors are one line, as the DDP script's are (``multigpu.ddp.script``). A snapshot
folder that another live run holds, or that was written with other settings
(``--lr`` and ``--momentum`` included), is refused in one line (status 2); a
finished run started again says so and trains nothing. Ranks that end with
different weights fail in one line (status 1), and so does every later round of the
run in that folder. Ctrl-C ends every rank with one line from rank 0,
``interrupted at step N; the last snapshot is step M, ...`` (status 130).
"""

from __future__ import annotations

import torch

from multigpu.core.train import History
from multigpu.ddp.agreement import WeightsDifferError, check_same_weights
from multigpu.ddp.configure import Run
from multigpu.ddp.script import log_line, run_script, start_training
from multigpu.runtime.launch import exit_rank
from multigpu.snapshot.cli import configure
from multigpu.snapshot.events import read_events, record_event
from multigpu.snapshot.files import SnapshotMismatchError
from multigpu.snapshot.injection import Fault
from multigpu.snapshot.lock import SnapshotInUseError
from multigpu.snapshot.loop import train_with_snapshots

# Refusals every rank reaches alike (the snapshot and the options are the same on
# every rank; the folder's lock is rank 0's, told to all): printed once.
REFUSALS = (SnapshotInUseError, SnapshotMismatchError)
# The event a round whose ranks ended with different (or non-finite) weights leaves
# in the snapshot folder: torchrun restarts the failed round, and the restart, which
# finds the run complete and loads one snapshot on every rank, must fail again.
WEIGHTS_DIFFER = "weights differ"


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point: check the options
    (:func:`~multigpu.snapshot.cli.configure`), train; the exit status
    (:func:`~multigpu.ddp.script.run_script`) (11)."""
    return run_script(argv, configure, train, REFUSALS, check_agreement)


def train(run: Run, device: torch.device) -> History:
    """This rank's training with :func:`~multigpu.snapshot.train_with_snapshots`;
    the History of this launch (11)."""
    args = run.args
    config, model, (X, y, X_test, y_test) = start_training(run, device, args.lr)
    fault = None
    if args.kill_rank is not None:
        fault = Fault(args.kill_rank, args.kill_at_step)
    return train_with_snapshots(
        model,
        X,
        y,
        config,
        args.snapshot,
        args.snapshot_every,
        X_test=X_test,
        y_test=y_test,
        fault=fault,
        step_delay=args.step_delay,
        log=log_line,
    )


def check_agreement(run: Run, parameters: dict) -> None:
    """:func:`~multigpu.ddp.check_same_weights`; also fail if an earlier round of
    the run in the snapshot folder ended with weights that differ (11)."""
    folder = run.args.snapshot
    try:
        check_same_weights(parameters)
    except WeightsDifferError as error:
        if run.env.rank == 0:
            record_event(folder, WEIGHTS_DIFFER, message=str(error))
        raise
    earlier = [e for e in read_events(folder) if e["event"] == WEIGHTS_DIFFER]
    if earlier:
        raise WeightsDifferError(
            f"{earlier[-1]['message']} (found at the end of an earlier round of the "
            f"run in {folder}, whose snapshot this one resumed: start afresh in a new "
            "snapshot folder)"
        )


if __name__ == "__main__":
    exit_rank(main())  # not `raise SystemExit`: see exit_rank
