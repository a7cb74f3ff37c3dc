"""The torchrun script (09)::

    torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2

Every rank trains ConvNet on the digits; rank 0 prints one line per epoch. With
``--snapshot DIR`` the loop of :mod:`multigpu.snapshot` runs instead (11); this entry
point is the only part of ``multigpu.ddp`` that imports it.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from multigpu.core.sharding import per_rank_batch_size
from multigpu.core.train import TrainConfig
from multigpu.ddp.accumulation import scaled_lr
from multigpu.ddp.cli import build_model, parse_args
from multigpu.ddp.loop import train_ddp_loop
from multigpu.runtime.launch import exit_rank
from multigpu.runtime.rank import (
    TABLE_NAMES,
    NotEnoughGPUsError,
    NotLaunchedByTorchrunError,
    rank_table,
    setup,
)


def main(argv: list[str] | None = None) -> int:
    """The torchrun entry point: train, print one line per epoch on rank 0 (09)."""
    args = parse_args(argv)
    try:
        env, device = setup(args.backend)
    except (NotLaunchedByTorchrunError, NotEnoughGPUsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        from multigpu.core.data import get_dataset, tensors
        from multigpu.core.reproducibility import set_seed

        config = TrainConfig(
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            momentum=args.momentum,
            seed=args.seed,
        )
        set_seed(config.seed)
        model = build_model(args.sync_bn, device)
        X, y = tensors(get_dataset("digits", train=True))
        X_test, y_test = tensors(get_dataset("digits", train=False))
        if args.samples is not None:
            X, y = X[: args.samples], y[: args.samples]
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
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_rank(main())  # not `raise SystemExit`: see exit_rank
