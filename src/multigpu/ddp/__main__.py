"""The torchrun script (09)::

    torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2

Every rank trains ConvNet on the digits; rank 0 prints one line per epoch. With
``--snapshot DIR`` the loop of :mod:`multigpu.snapshot` runs instead (11); this entry
point is the only part of ``multigpu.ddp`` that imports it. Under torchrun's
restarts the script needs ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which torchrun
reads before it starts the ranks, so it goes in the shell (the script refuses to
start without it, giving this command) (11)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 \\
        --max-restarts=3 -m multigpu.ddp --snapshot DIR --kill-rank 1 --kill-at-step 13

Errors are one line: a wrong option stops every rank before the process group
starts (rank 0 prints ``...: error: <what to fix>``, exit status 2); a rank that
fails while it trains prints ``rank R: <its error>`` and exits with status 1, before
torchrun's summary. A snapshot folder that another live run holds, or that was
written with other settings (``--lr`` and ``--momentum`` included), is refused in
one line too (status 2); a finished run started again says so and trains nothing.
Ranks that end with different weights, or weights that are not finite, fail with
one line naming the first tensor concerned (status 1). Ctrl-C ends every rank with
one line from rank 0, ``interrupted at step N; the last snapshot is step M, ...``
(status 130). ``--timeout SECONDS`` (default 60, from 1 to a week) bounds every
collective: a hung rank makes its peers fail after that long instead of gloo's 30
minutes (11).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from multigpu.core.devices import choose_backend
from multigpu.core.sharding import per_rank_batch_size
from multigpu.core.train import History, TrainConfig
from multigpu.ddp.accumulation import scaled_lr
from multigpu.ddp.agreement import AGREE, WeightsDifferError, check_same_weights
from multigpu.ddp.cli import (
    build_model,
    check_backend,
    check_restarts,
    check_run,
    parse_args,
    speaks_for_the_run,
)
from multigpu.ddp.loop import Interrupted, train_ddp_loop
from multigpu.runtime.checkpoint import CheckpointMismatchError
from multigpu.runtime.launch import exit_rank
from multigpu.runtime.rank import (
    TABLE_NAMES,
    NotEnoughGPUsError,
    NotLaunchedByTorchrunError,
    RankEnv,
    rank_table,
    read_rank_env,
    setup,
)
from multigpu.snapshot import (
    SnapshotInUseError,
    SnapshotMismatchError,
    read_events,
    record_event,
)

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point: train, print one line per epoch on rank 0 (09).

    Returns the exit status: 0; 2 for a usage error (before the process group
    starts) or a snapshot folder this run may not use (in use by another run, or
    written with other settings); 1 for a rank that failed while it trained (its
    error in one line) or ranks that ended with different weights; 130 for Ctrl-C,
    after rank 0 has said where the run stood (one line, no traceback) (11)."""
    finished: list[History] = []
    try:
        return _main(argv, finished)
    except KeyboardInterrupt as interrupt:  # torchrun passes Ctrl-C on to every rank
        if os.environ.get("RANK", "0") == "0":
            print(_interrupted_line(interrupt, finished), file=sys.stderr, flush=True)
        return 130


def _main(argv: list[str] | None, finished: list[History]) -> int:
    """:func:`main`, which appends the History to ``finished`` once trained."""
    args = parse_args(argv)
    try:
        env = read_rank_env()
    except NotLaunchedByTorchrunError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    check_restarts(argv)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    check_backend(args.backend, local_world_size, torch.cuda.device_count())
    data = _load_data(args)
    check_run(args, env.world_size, len(data[0]), _epoch_steps(args, env, data))
    try:
        env, device = join_group(args.backend, args.timeout)
        finished.append(_train(args, env, device, data))
        _check_agreement(args.snapshot, env.rank, finished[-1].parameters)
        if env.rank == 0:
            print(AGREE, flush=True)
    except NotEnoughGPUsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except REFUSALS as error:  # every rank raises the same: rank 0 says it once
        if speaks_for_the_run():
            print(f"error: {_one_line(error)}", file=sys.stderr, flush=True)
        return 2
    except WeightsDifferError as error:  # every rank knows; rank 0 says it
        if env.rank == 0:
            print(str(error), file=sys.stderr, flush=True)
        return 1
    except Exception as error:  # one line, not a traceback per rank (11)
        print(f"rank {env.rank}: {_one_line(error)}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


# The event a round whose ranks ended with different (or non-finite) weights leaves
# in the snapshot folder: torchrun restarts the failed round, and the restart, which
# finds the run complete and loads one snapshot on every rank, must fail again.
WEIGHTS_DIFFER = "weights differ"


def _check_agreement(folder: str | None, rank: int, parameters: dict) -> None:
    """:func:`check_same_weights`; with a snapshot folder, also fail if an earlier
    round of the run in that folder ended with weights that differ (11)."""
    try:
        check_same_weights(parameters)
    except WeightsDifferError as error:
        if folder is not None and rank == 0:
            record_event(folder, WEIGHTS_DIFFER, message=str(error))
        raise
    if folder is None:
        return
    earlier = [e for e in read_events(folder) if e["event"] == WEIGHTS_DIFFER]
    if earlier:
        raise WeightsDifferError(
            f"{earlier[-1]['message']} (found at the end of an earlier round of the "
            f"run in {folder}, whose snapshot this one resumed: start afresh in a new "
            "snapshot folder)"
        )


# Refusals every rank reaches alike (the snapshot and the options are the same on
# every rank; the folder's lock is rank 0's, told to all): printed once.
REFUSALS = (SnapshotInUseError, SnapshotMismatchError, CheckpointMismatchError)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _interrupted_line(interrupt: KeyboardInterrupt, finished: list[History]) -> str:
    """What rank 0 prints for Ctrl-C: the loop's :class:`Interrupted` line, or
    when it came before or after the training loop."""
    if isinstance(interrupt, Interrupted):
        return str(interrupt)
    if finished:
        return "interrupted after training, while the ranks compared their weights"
    return "interrupted before this run trained a step"


def join_group(backend: str, timeout: float) -> tuple[RankEnv, torch.device]:
    """:func:`multigpu.runtime.rank.setup`, with collectives that give up after
    ``timeout`` seconds (11). gloo's group is joined here with that timeout (which
    also bounds the ranks' meeting); nccl's by ``setup``, after it has picked this
    rank's GPU, and then given the timeout."""
    if (choose_backend() if backend == "auto" else backend) == "gloo":
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    env, device = setup(backend)
    dist.set_timeout(timedelta(seconds=timeout))
    return env, device


def _load_data(args: argparse.Namespace) -> Data:
    """The digits: training set (its first ``--samples``) and test set."""
    from multigpu.core.data import get_dataset, tensors

    X, y = tensors(get_dataset("digits", train=True))
    X_test, y_test = tensors(get_dataset("digits", train=False))
    if args.samples is not None:
        X, y = X[: args.samples], y[: args.samples]
    return X, y, X_test, y_test


def _epoch_steps(args: argparse.Namespace, env: RankEnv, data: Data) -> int:
    """Optimizer steps per epoch of the loop the options choose; 0 if the batch
    does not split over the ranks (``check_run`` says so)."""
    if args.batch_size % env.world_size:
        return 0
    if args.snapshot is not None:
        from multigpu.snapshot.loop import snapshot_epoch_steps

        return snapshot_epoch_steps(len(data[0]), args.batch_size, env.world_size)
    return len(data[0]) // args.batch_size


def _train(
    args: argparse.Namespace, env: RankEnv, device: torch.device, data: Data
) -> History:
    """Train as the options say; this rank's History."""
    from multigpu.core.reproducibility import set_seed

    X, y, X_test, y_test = data
    config = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        seed=args.seed,
    )
    set_seed(config.seed)
    model = build_model(args.sync_bn, device)
    if args.float64:
        model, X, X_test = model.double(), X.double(), X_test.double()
    if env.rank == 0:
        per_rank = per_rank_batch_size(config.batch_size, env.world_size)
        lr = scaled_lr(config.lr, env.world_size, args.lr_scaling)
        print(
            f"{env.world_size} ranks ({dist.get_backend()}), global batch "
            f"{config.batch_size} = {env.world_size} x {per_rank}, lr {lr:g}",
            flush=True,
        )
    if args.show_ranks:  # notebook 11: who is who on several nodes
        table = rank_table()
        if env.rank == 0:
            print(" | ".join(TABLE_NAMES), flush=True)
            for row in table:
                print(" | ".join(row[name] for name in TABLE_NAMES), flush=True)
    if args.snapshot is not None:  # notebook 11: snapshots and restarts
        from multigpu.snapshot import Fault, train_with_snapshots  # (11)

        fault = None
        if args.kill_rank is not None:
            fault = Fault(args.kill_rank, args.kill_at_step)
        history = train_with_snapshots(
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
            log=lambda line: print(line, flush=True),
        )
    else:
        history = train_ddp_loop(
            model,
            X,
            y,
            config,
            X_test=X_test,
            y_test=y_test,
            accumulation=args.accumulation,
            lr_scaling=args.lr_scaling,
            amp=args.amp,
            checkpoint=args.checkpoint,
            resume_from_checkpoint=args.resume,
            progress=args.progress,
            log=lambda line: print(line, flush=True),
        )
    return history


if __name__ == "__main__":
    exit_rank(main())  # not `raise SystemExit`: see exit_rank
