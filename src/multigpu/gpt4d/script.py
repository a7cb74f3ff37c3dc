"""What the 4-D torchrun script does once its options hold (19).

Picks the backend and device from the environment (nccl and ``cuda:LOCAL_RANK``
where GPUs are, gloo and the CPU otherwise), starts the process group, builds the
grid's groups, trains with :func:`~multigpu.gpt4d.hand.train_4d`, prints the loss
from the rank that holds it, and with ``--check`` compares every rank's weights
with one process (an all-reduce of the largest difference).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from multigpu.gpt4d.cli import PROG
from multigpu.gpt4d.grid import build_groups
from multigpu.gpt4d.hand import reference_shards, train_4d
from multigpu.gpt4d.model import make_token_batches, one_process_training
from multigpu.runtime.quiet_ranks import exit_quietly

__all__ = ["pick_backend", "run"]


def pick_backend(
    choice: str, environ: Mapping[str, str] | None = None
) -> tuple[str, torch.device]:
    """``choice`` ("auto", "gloo", "nccl") -> the backend and this rank's device;
    nccl with more ranks on this node than GPUs stops every rank (the same check
    on each) with one line from rank 0, exit status 2 (19)."""
    environ = os.environ if environ is None else environ
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    local_ranks = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = choice if choice != "auto" else ("nccl" if gpus else "gloo")
    if backend == "nccl" and local_ranks > gpus:
        if environ.get("RANK", "0") == "0":
            print(
                f"{PROG}: error: nccl needs one GPU per rank: {local_ranks} ranks on "
                f"this node and {gpus} GPUs; use --backend gloo or at most {gpus} "
                "ranks per node.",
                file=sys.stderr,
            )
        exit_quietly(environ)  # rank 0 prints the line first
    if backend == "nccl":
        return backend, torch.device("cuda", local_rank)
    return backend, torch.device("cpu")


def run(args: Any) -> int:
    """Train on this rank's part of the grid; the exit status (19)."""
    backend, device = pick_backend(args.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        rank, grid = dist.get_rank(), args.grid
        groups = build_groups(grid, rank)
        dtype = torch.float64 if args.float64 else torch.float32
        sizes = tuple(args.batch + (step % 2) for step in range(args.steps))
        batches = make_token_batches(args.config, sizes, seed=args.seed + 1)
        if rank == 0:
            ranks = f"{grid.world_size} rank{'s' if grid.world_size > 1 else ''}"
            where = f"{ranks}, {backend}, {device.type}"
            print(f"grid {grid.label()} on {where}")
        stage, losses = train_4d(
            args.config,
            groups,
            batches,
            dtype,
            args.lr,
            args.microbatches,
            args.seed,
            device,
        )
        if rank == grid.rank_of(pp=grid.pp - 1):
            for step, loss in enumerate(losses):
                print(f"step {step}: loss {loss:.4f}")
        if args.check:
            reference, _ = one_process_training(
                args.config, batches, dtype, args.lr, args.seed
            )
            expected = reference_shards(reference, stage)
            held = dict(stage.named_parameters())
            diff = max(
                (held[n].cpu() - expected[n]).abs().max().item() for n in expected
            )
            worst = torch.tensor([diff], dtype=torch.float64, device=device)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            tolerance = 1e-10 if args.float64 else 1e-5
            if rank == 0:
                print(
                    f"every rank equal to one process (max |diff| < {tolerance:g}): "
                    f"{worst.item() < tolerance}"
                )
            if worst.item() >= tolerance:
                return 1
        return 0
    finally:
        dist.destroy_process_group()
