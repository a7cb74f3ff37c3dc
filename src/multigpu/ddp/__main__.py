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
torchrun's summary. ``--timeout SECONDS`` (default 60) bounds every collective: a
hung rank makes its peers fail after that long instead of gloo's 30 minutes (11).
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from multigpu.core.devices import choose_backend
from multigpu.core.sharding import per_rank_batch_size
from multigpu.core.train import TrainConfig
from multigpu.ddp.accumulation import scaled_lr
from multigpu.ddp.cli import build_model, check_restarts, check_run, parse_args
from multigpu.ddp.loop import train_ddp_loop
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

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point: train, print one line per epoch on rank 0 (09).

    Returns the exit status: 0, 2 for a usage error (before the process group
    starts), 1 for a rank that failed while it trained (its error in one line)."""
    args = parse_args(argv)
    try:
        env = read_rank_env()
    except NotLaunchedByTorchrunError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    check_restarts(argv)
    data = _load_data(args)
    check_run(args, env.world_size, len(data[0]), _epoch_steps(args, env, data))
    try:
        env, device = join_group(args.backend, args.timeout)
        _train(args, env, device, data)
    except NotEnoughGPUsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # one line, not a traceback per rank (11)
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"rank {env.rank}: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


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
) -> None:
    """Train as the options say, and check on rank 0 that the ranks agree."""
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
        from multigpu.snapshot import Fault, train_with_snapshots

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
    weights = torch.cat([t.flatten().double() for t in history.parameters.values()])
    same = torch.stack([weights.sum(), weights.abs().sum()])
    gathered = [torch.zeros_like(same) for _ in range(env.world_size)]
    dist.all_gather(gathered, same)
    if env.rank == 0:
        agree = all(torch.equal(g, gathered[0]) for g in gathered)
        print(f"every rank holds the same weights: {agree}", flush=True)


if __name__ == "__main__":
    exit_rank(main())  # not `raise SystemExit`: see exit_rank
