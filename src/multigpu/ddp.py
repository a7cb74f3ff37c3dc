"""DistributedDataParallel with torchrun: a training script and its parts.

Taught in ``notebooks/09_ddp_torchrun.ipynb`` (the script, the sampler, evaluation)
and ``notebooks/09b_ddp_in_practice.ipynb`` (checkpoints, accumulation, SyncBatchNorm,
uneven data, ports, AMP); ``notebooks/11_fault_tolerance.ipynb`` runs it with
snapshots, restarts and injected faults (``--snapshot``, ``multigpu.snapshot``).
Run as a module under torchrun, every rank trains ConvNet
on the offline digits data and rank 0 prints one line per epoch::

    torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2

(``--help`` lists the options.) With snapshots every 5 steps, torchrun restarting
the ranks up to 3 times, and rank 1 killing itself before step 13 (11)::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 -m multigpu.ddp \
        --snapshot DIR --kill-rank 1 --kill-at-step 13

Started with plain ``python`` it stops with an error
that says to use torchrun. The same parts run from a notebook through
:func:`multigpu.runtime.launch.spawn` (:func:`train_ddp`) and
:func:`multigpu.runtime.launch.run_torchrun` (the script itself).

It is notebook 08's recipe with the library doing the work:

- **launch**: torchrun starts one process per rank and sets ``RANK``,
  ``LOCAL_RANK`` and ``WORLD_SIZE`` (:func:`read_rank_env`); :func:`setup` picks the
  backend (gloo on CPU, nccl with one GPU per rank, ``torch.cuda.set_device`` first)
  and joins the process group;
- **data**: a ``DistributedSampler`` deals a seeded shuffle to the ranks with the
  same stride as 08's ``DataPartitioner``; ``set_epoch`` every epoch, and
  ``shuffle=False`` on the loader (the sampler shuffles) (:func:`distributed_loader`);
- **gradients**: ``DistributedDataParallel`` broadcasts rank 0's weights when it is
  built and averages the gradients during ``backward()`` (:func:`wrap`);
- **metrics**: averaged over the ranks with an all-reduce (:func:`reduce_value`);
  evaluation counts every sample exactly once (:func:`evaluate_distributed`),
  unlike the common sum over a padded ``DistributedSampler``
  (:func:`evaluate_padded`, kept to show the bias);
- **checkpoints**: rank 0 saves atomically, the others wait at a barrier, every rank
  loads with ``map_location`` (:func:`save_on_main`, :func:`resume`).

PyTorch's files: https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py
and https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

from multigpu.allreduce_sgd import per_rank_batch_size
from multigpu.allreduce_sgd import train_worker as allreduce_sgd_worker
from multigpu.core.checks import check_choice, check_positive_int
from multigpu.core.train import (
    BAR_FORMAT,
    History,
    TrainConfig,
    cpu_state_dict,
    evaluation_sums,
)
from multigpu.runtime.checkpoint import load_checkpoint, save_checkpoint, unwrap
from multigpu.runtime.launch import (  # noqa: F401
    DEFAULT_DEADLINE_S,
    TorchrunError,
    exit_rank,
    in_one_launch,
    run_torchrun,
    spawn,
)
from multigpu.runtime.rank import (  # noqa: F401 (the rank environment, taught in 09)
    COMMAND,
    ENV_NAMES,
    TABLE_NAMES,
    NotEnoughGPUsError,
    NotLaunchedByTorchrunError,
    RankEnv,
    is_main_process,
    rank_device,
    rank_table,
    read_rank_env,
    reduce_value,
    setup,
)

LR_SCALINGS = ("none", "linear")  # names accepted by `lr_scaling=`
# How gradient accumulation keeps DDP from syncing every micro-batch: the context
# manager, PyTorch's flag set before the forward (right), or after it (the trap).
ACCUMULATIONS = ("no_sync", "flag_before_forward", "flag_after_forward")


def wrap(model: nn.Module, device: torch.device | None = None, **options: Any) -> DDP:
    """``DistributedDataParallel(model)``: no ``device_ids`` on CPU, this rank's GPU
    on CUDA. Building it broadcasts rank 0's weights and buffers to every rank (09).
    ``options`` go to DDP (e.g. ``find_unused_parameters=True``)."""
    device = rank_device() if device is None else device
    model = model.to(device)
    if device.type == "cuda":
        return DDP(model, device_ids=[device.index], **options)
    return DDP(model, **options)


# ----------------------------------------------------------------------------------
# Data


def distributed_loader(
    dataset: Any,
    global_batch: int,
    rank: int,
    world_size: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
) -> DataLoader:
    """This rank's loader: a ``DistributedSampler`` and ``global_batch / world_size``
    samples per batch (09).

    The sampler shuffles (with ``seed + epoch``: call ``loader.sampler.set_epoch``
    every epoch) and deals every ``world_size``-th index to this rank, so the loader
    itself gets ``shuffle=False``. ``drop_last=True`` drops each rank's last partial
    batch, so every step has the full global batch, as in 08.
    """
    per_rank = per_rank_batch_size(global_batch, world_size)
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed
    )
    return DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=sampler,
        shuffle=False,
        drop_last=drop_last,
    )


def sampler_shards(
    num_samples: int,
    world_size: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> list[list[int]]:
    """The indices ``DistributedSampler`` gives each rank, by rank; no process group
    needed. N=10 on 4 ranks: ``[0,4,8] [1,5,9] [2,6,0] [3,7,1]`` (09)."""
    shards = []
    for rank in range(world_size):
        sampler = DistributedSampler(
            range(num_samples),
            num_replicas=world_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def exact_shard(num_samples: int, rank: int, world_size: int) -> torch.Tensor:
    """Indices ``rank, rank + W, ...`` below ``num_samples``: the sampler's stride
    without its padding, so every sample belongs to exactly one rank (09)."""
    return torch.arange(rank, num_samples, world_size)


# ----------------------------------------------------------------------------------
# Evaluation


def _sums(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """[sum of losses, correct, count] of ``model`` on X, y as a float64 tensor,
    from :func:`multigpu.core.train.evaluation_sums` over batches of ``batch_size``."""
    module = unwrap(model)  # no DDP forward: it may sync buffers, a collective
    batches = (
        (X[start : start + batch_size], y[start : start + batch_size])
        for start in range(0, len(y), batch_size)
    )
    return torch.tensor(evaluation_sums(module, batches), dtype=torch.float64)


def evaluate_distributed(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over all of X (N, ...), y (N,), each rank
    evaluating its :func:`exact_shard`; every sample counts exactly once (09).

    The ranks all-reduce three sums (loss, correct, count), so every rank returns
    the numbers one process would compute with :func:`multigpu.core.train.evaluate`: the
    same accuracy exactly, the loss up to the order of float additions.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    shard = exact_shard(len(y), rank, world_size)
    sums = reduce_value(_sums(model, X[shard], y[shard], batch_size), average=False)
    return sums[0].item() / sums[2].item(), sums[1].item() / sums[2].item()


def evaluate_padded(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    divide_by: str = "dataset",
    batch_size: int = 512,
) -> float:
    """The common, biased accuracy: each rank counts its correct predictions over a
    ``DistributedSampler`` (which pads with repeated samples), the counts are summed,
    and the sum is divided by ``len(dataset)`` or by the sampler's ``total_size``.
    Shown in notebook 09 to be wrong; use :func:`evaluate_distributed` (09)."""
    check_choice("divide_by", divide_by, ("dataset", "total_size"))
    sampler = DistributedSampler(
        range(len(y)),
        num_replicas=dist.get_world_size(),
        rank=dist.get_rank(),
        shuffle=False,
    )
    shard = torch.tensor(list(sampler), dtype=torch.long)
    correct = reduce_value(_sums(model, X[shard], y[shard], batch_size)[1], False)
    denominator = len(y) if divide_by == "dataset" else sampler.total_size
    return correct.item() / denominator


# ----------------------------------------------------------------------------------
# One optimizer step with gradient accumulation


def scaled_lr(lr: float, world_size: int, lr_scaling: str = "none") -> float:
    """The learning rate to use on ``world_size`` ranks (09).

    ``"none"``: ``lr`` unchanged. With averaged gradients N ranks at b samples each
    train exactly like one process at N·b samples and the same lr (08), so nothing
    needs fixing. ``"linear"``: ``lr × world_size``, a choice for when the per-rank
    batch is kept and the global batch grows with the world size: it keeps the step
    per sample roughly as it was (Goyal et al., 2017).
    """
    check_choice("lr_scaling", lr_scaling, LR_SCALINGS)
    return lr * world_size if lr_scaling == "linear" else lr


def _autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on CPU, float16 on CUDA; nothing when ``amp`` is False."""
    if not amp:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def accumulate(
    model: DDP,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    how: str = "no_sync",
    amp: bool = False,
    scaler: Any = None,
    after_backward: Callable[[int], None] | None = None,
) -> float:
    """Forward and backward every micro-batch; gradients are synced only on the last
    one. Returns the mean loss over the micro-batches (09b).

    The loss of each (equal-sized) micro-batch is divided by their number, so the
    summed gradients are those of the mean loss over the whole per-rank batch.
    ``how``: ``"no_sync"`` (DDP's context manager around forward *and* backward);
    ``"flag_before_forward"`` (``model.require_backward_grad_sync`` set before the
    forward, the same thing); ``"flag_after_forward"`` (the flag set between forward
    and backward: DDP reads it in the forward, so the syncs land on the wrong
    micro-batches and the ranks drift apart). ``after_backward(i)`` is called
    after micro-batch i's backward (to watch what happened).
    """
    check_choice("accumulation", how, ACCUMULATIONS)
    device = next(model.parameters()).device
    count = len(micro_batches)
    total = 0.0
    for i, (X, y) in enumerate(micro_batches):
        last = i == count - 1
        if how == "flag_before_forward":
            model.require_backward_grad_sync = last
        context = model.no_sync() if how == "no_sync" and not last else None
        with context or contextlib.nullcontext():
            with _autocast(device, amp):
                loss = nn.functional.cross_entropy(model(X), y) / count
            if how == "flag_after_forward":
                model.require_backward_grad_sync = last  # too late for this forward
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if after_backward is not None:
            after_backward(i)
        total += loss.item()
    return total


# ----------------------------------------------------------------------------------
# Checkpoints


def save_on_main(
    path: str | os.PathLike, model: nn.Module, optimizer: Any, epoch: int, **extra: Any
) -> None:
    """Rank 0 saves atomically (``checkpoint.save_checkpoint``: no ``module.``
    prefix), then every rank waits at a barrier, so none reads it too early (09b)."""
    if is_main_process():
        save_checkpoint(path, model, optimizer, epoch=epoch, **extra)
    if dist.is_initialized():
        dist.barrier()


def resume(
    path: str | os.PathLike, model: nn.Module, optimizer: Any, device: torch.device
) -> int:
    """Load the checkpoint into every rank (tensors straight to ``device`` with
    ``map_location``, not to the GPU they were saved from); return the epoch to
    start at, 0 when there is no file yet (09b)."""
    if not Path(path).exists():
        return 0
    checkpoint = load_checkpoint(path, model, optimizer, map_location=device)
    return int(checkpoint["epoch"] or 0)


# ----------------------------------------------------------------------------------
# The training loop


def train(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    *,
    X_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    accumulation: int = 1,
    how: str = "no_sync",
    lr_scaling: str = "none",
    amp: bool = False,
    set_epoch: bool = True,
    checkpoint: str | os.PathLike | None = None,
    resume_from_checkpoint: bool = False,
    stop_after_epochs: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    wrap_options: Mapping[str, Any] | None = None,
) -> History:
    """Train ``model`` with DDP in a running process group; this rank's History (09).

    X (N, ...), y (N,): the whole training set, which every rank holds; the
    ``DistributedSampler`` picks this rank's samples. ``config.batch_size`` is the
    global batch of one optimizer step, split over the ranks and then into
    ``accumulation`` micro-batches. ``History.step_loss`` holds this rank's losses,
    ``train_loss`` the epoch means averaged over the ranks, ``test_*`` come from
    :func:`evaluate_distributed`. ``checkpoint``: a file rank 0 writes after every
    epoch; ``resume_from_checkpoint``: start from it if it exists.
    ``stop_after_epochs``: stop early (to simulate an interrupted run).
    Only rank 0 shows progress and calls ``log``.
    """
    check_positive_int("accumulation", accumulation)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    per_rank = per_rank_batch_size(config.batch_size, world_size)
    if per_rank % accumulation:
        raise ValueError(
            f"A per-rank batch of {per_rank} does not split into {accumulation} "
            "equal micro-batches. Choose a global batch that is a multiple of "
            f"world_size x accumulation = {world_size * accumulation}."
        )
    main = rank == 0
    model = wrap(copy.deepcopy(model), device, **dict(wrap_options or {}))
    lr = scaled_lr(config.lr, world_size, lr_scaling)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=config.momentum)
    scaler = torch.amp.GradScaler("cuda") if amp and device.type == "cuda" else None
    loader = distributed_loader(
        TensorDataset(X, y), config.batch_size, rank, world_size, config.seed
    )
    start_epoch = 0
    if checkpoint is not None and resume_from_checkpoint:
        start_epoch = resume(checkpoint, model, optimizer, device)
        if main and log and start_epoch:
            log(f"resumed from the checkpoint of epoch {start_epoch}")
    history = History(rank=rank, world_size=world_size)
    last_epoch = config.epochs
    if stop_after_epochs is not None:
        last_epoch = min(last_epoch, start_epoch + stop_after_epochs)
    for epoch in range(start_epoch, last_epoch):
        start = time.perf_counter()
        if set_epoch:
            loader.sampler.set_epoch(epoch)  # a new shuffle every epoch
        model.train()
        losses = []
        batches = tqdm(
            loader,
            desc=f"epoch {epoch + 1}/{config.epochs}",
            disable=not (progress and main),
            bar_format=BAR_FORMAT,
            file=sys.stderr,
            mininterval=0.5,
        )
        for xb, yb in batches:  # (per_rank, C, H, W), (per_rank,)
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            micro = list(zip(xb.chunk(accumulation), yb.chunk(accumulation)))
            loss = accumulate(model, micro, how, amp, scaler)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            losses.append(loss)
        batches.close()
        mean = torch.tensor(sum(losses) / len(losses), dtype=torch.float64)
        history.step_loss.extend(losses)
        history.train_loss.append(reduce_value(mean).item())  # over all ranks
        line = f"epoch {epoch + 1}/{config.epochs}: "
        line += f"train loss {history.train_loss[-1]:.4f}"
        if X_test is not None and y_test is not None:
            test_loss, accuracy = evaluate_distributed(model, X_test, y_test)
            history.test_loss.append(test_loss)
            history.test_accuracy.append(accuracy)
            line += f", test loss {test_loss:.4f}, test accuracy {accuracy:.4f}"
        if checkpoint is not None:
            save_on_main(checkpoint, model, optimizer, epoch + 1, config=config)
        history.seconds.append(time.perf_counter() - start)
        if main and log:
            log(line)
    history.parameters = cpu_state_dict(unwrap(model))
    return history


def train_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    options: Mapping[str, Any],
) -> History:
    """What each rank runs under :func:`train_ddp` (09)."""
    return train(model, X, y, config, progress=False, log=None, **options)


def train_ddp(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    timeout: float | None = 30.0,
    deadline: float | None = DEFAULT_DEADLINE_S,
    backend: str = "gloo",
    **options: Any,
) -> list[History]:
    """Train with DDP on ``world_size`` processes started by ``launch.spawn``; one
    History per rank, by rank. ``options``: the keywords of :func:`train` (09, 09b)."""
    per_rank_batch_size(config.batch_size, world_size)  # fail before starting
    return spawn(
        train_worker,
        world_size,
        model,
        X,
        y,
        config,
        options,
        backend=backend,
        timeout=timeout,
        deadline=deadline,
    )


def compare_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    options: Mapping[str, Any],
) -> dict[str, History]:
    """DDP and 08's hand-written all-reduce SGD on the same ranks, same data (09)."""
    by_hand = allreduce_sgd_worker(rank, world_size, model, X, y, {"08": config})["08"]
    ddp = train(model, X, y, config, progress=False, log=None, **options)
    return {"ddp": ddp, "allreduce_sgd": by_hand}


# ----------------------------------------------------------------------------------
# The script


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
            history = train(
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


# ----------------------------------------------------------------------------------
# What the ranks run in the demonstrations of notebooks 09 and 09b and in the tests


def broadcast_at_construction(rank: int, world_size: int, seed: int = 0) -> dict:
    """Each rank builds ConvNet from its *own* seed (``seed + rank``), then wraps it
    in DDP. Returns whether the ranks' weights differed before and agree after (09)."""
    from multigpu.core.models import ConvNet
    from multigpu.core.reproducibility import set_seed

    set_seed(seed + rank)
    model = ConvNet()

    def fingerprints() -> list[torch.Tensor]:
        flat = torch.cat([t.flatten() for t in model.state_dict().values()])
        gathered = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        return gathered

    before = fingerprints()
    wrapped = wrap(model)
    after = fingerprints()
    mine = torch.cat([t.flatten() for t in wrapped.module.state_dict().values()])
    return {
        "rank": rank,
        "differed before": any(not torch.equal(t, before[0]) for t in before[1:]),
        "agree after": all(torch.equal(t, after[0]) for t in after),
        "equal rank 0's initial weights": torch.equal(mine, before[0]),
    }


def evaluation_worker(
    rank: int, world_size: int, model: nn.Module, X: torch.Tensor, y: torch.Tensor
) -> dict[str, float]:
    """Accuracy of ``model`` on X, y three ways: every sample once, and the padded
    sampler's sum divided by the dataset length and by ``total_size`` (09)."""
    _, exact = evaluate_distributed(model, X, y)
    return {
        "every sample once": exact,
        "padded / len(dataset)": evaluate_padded(model, X, y, "dataset"),
        "padded / total_size": evaluate_padded(model, X, y, "total_size"),
    }


def uneven_inputs(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    join: bool,
) -> int:
    """Rank r trains on r + 1 batches of 4 samples. Without ``Join`` the ranks with
    fewer batches leave while the others wait in a gradient all-reduce that never
    completes; with ``torch.distributed.algorithms.Join`` the finished ranks shadow
    the others' all-reduces. Returns the batches this rank trained on (09b).

    Without ``Join``, a rank that has run out spends a second on end-of-epoch work
    (a stand-in for an evaluation) before its barrier, so the rank stuck in the
    all-reduce is the first to reach the timeout and the error names it; without
    that head start, which rank times out first is a race of milliseconds."""
    from torch.distributed.algorithms import Join

    ddp_model = wrap(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    steps = rank + 1
    context = Join([ddp_model]) if join else contextlib.nullcontext()
    with context:
        for step in range(steps):
            xb, yb = X[4 * step : 4 * step + 4], y[4 * step : 4 * step + 4]
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp_model(xb), yb).backward()
            optimizer.step()
    if not join and steps < world_size:
        time.sleep(1.0)  # end-of-epoch work: the stuck rank times out first
    dist.barrier()  # the end of an epoch: e.g. before rank 0 saves a checkpoint
    return steps


def sync_batchnorm_on_cpu(rank: int, world_size: int) -> None:
    """``nn.SyncBatchNorm`` on CPU tensors in a group of ``world_size`` ranks: raises
    PyTorch's own error (09b)."""
    layer = nn.SyncBatchNorm(4)
    layer(torch.randn(8, 4, 2, 2))


def accumulation_syncs(
    rank: int, world_size: int, model: nn.Module, X: torch.Tensor, how: str
) -> list[int]:
    """:func:`accumulation_syncs_n` with 3 micro-batches per step (09b)."""
    return accumulation_syncs_n(rank, world_size, model, X, how, 3)


def accumulation_syncs_n(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    how: str,
    micro_batches: int,
) -> list[int]:
    """Two optimizer steps of ``micro_batches`` each through :func:`accumulate`
    ``how``; returns, for every micro-batch, how many gradient all-reduces its
    backward started (09b).

    A communication hook counts the buckets DDP reduces; this small model fits in
    one bucket, so a synced backward shows 1 and an unsynced one 0.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    ddp_model = wrap(copy.deepcopy(model))
    calls = [0]

    def counting_hook(state, bucket):  # no annotations: DDP checks them
        calls[0] += 1
        return allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(None, counting_hook)
    y = torch.zeros(len(X), dtype=torch.long)
    counts: list[int] = []

    def record(micro_step: int) -> None:
        counts.append(calls[0] - sum(counts))

    size = 2 * micro_batches  # samples per step, 2 per micro-batch
    for step in range(2):
        starts = range(size * step, size * (step + 1), 2)
        micro = [(X[i : i + 2], y[i : i + 2]) for i in starts]
        accumulate(ddp_model, micro, how, after_backward=record)
    return counts


def torchrun_on_port(
    port: int,
    nproc_per_node: int = 2,
    module: str = "multigpu.workers",
    timeout: float = 60.0,
) -> str:
    """Run ``torchrun --nproc-per-node=N --master-port=PORT -m module``, the way the
    common walk-throughs launch (a fixed port, no ``--standalone``), and return what
    it printed, stdout and stderr. When another program holds ``port`` it fails
    with ``EADDRINUSE``; the run is stopped after ``timeout`` seconds (09b).
    ``launch.run_torchrun`` uses ``--standalone``, a free port, unless told a port."""
    try:
        result = run_torchrun(
            module, nproc_per_node, timeout=timeout, check=False, master_port=port
        )
    except TorchrunError:
        return f"(stopped after {timeout} s)"
    return result.stdout + result.stderr


def eaddrinuse_lines(output: str) -> list[str]:
    """The lines of torchrun's output that name the clash, port numbers replaced by
    ``PORT`` so that they read the same on every run (09b)."""
    import re

    lines = [line.strip() for line in output.splitlines()]
    found = [line for line in lines if "EADDRINUSE" in line]
    return [re.sub(r"port: \d+", "port: PORT", line) for line in dict.fromkeys(found)]


def step_times(
    rank: int,
    world_size: int,
    per_rank_batch: int = 32,
    steps: int = 20,
    model: nn.Module | None = None,
    input_shape: tuple[int, ...] = (1, 8, 8),
) -> dict[str, float]:
    """Median seconds of one training step of ``model`` (ConvNet by default) on this
    rank, with DDP's gradient all-reduce and without it (inside ``no_sync``), taking
    turns; the slowest rank's time per step counts; and the number of buckets DDP
    all-reduced, from its logging data (bench/ddp.py, 09, 12)."""
    import statistics

    from multigpu.core.models import ConvNet

    torch.manual_seed(0)
    model = wrap(copy.deepcopy(model) if model is not None else ConvNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(per_rank_batch, *input_shape)
    y = torch.randint(0, 10, (per_rank_batch,))
    seconds: dict[str, list[float]] = {"synced": [], "no_sync": []}
    for step in range(steps + 1):
        for name in seconds:
            context = model.no_sync() if name == "no_sync" else contextlib.nullcontext()
            dist.barrier()
            start = time.perf_counter()
            with context:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(X), y).backward()
            optimizer.step()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step:  # step 0 warms up (and DDP rebuilds its buckets)
                seconds[name].append(elapsed.item())
    times = {name: statistics.median(values) for name, values in seconds.items()}
    sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
    times["buckets"] = float(len([size for size in sizes.split(",") if size.strip()]))
    return times
