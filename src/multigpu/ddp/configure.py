"""What a torchrun script checks before its process group starts (09, 11).

A script's ``configure(argv)`` (:func:`configure` for ``python -m multigpu.ddp``,
``multigpu.snapshot.cli.configure`` for notebook 11's) parses its options, then
:func:`prepare` checks them against the run: torchrun's restarts, the node's GPUs,
the data and the ranks. Any that does not fit stops the script in one line (exit
status 2) before the process group starts; what passes is a :class:`Run`, which
:func:`multigpu.ddp.script.run_script` hands to the script's training.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from multigpu.ddp.cli import (
    MODULE,
    check_accumulation,
    check_backend,
    check_restarts,
    check_run,
    parse_args,
)
from multigpu.runtime.rank import (
    COMMAND,
    NotLaunchedByTorchrunError,
    RankEnv,
    read_rank_env,
)

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Run:
    """A run whose options fit it: the options, this rank, the digits (training
    set, its first ``--samples``, and test set) and the optimizer steps of an
    epoch (09, 11)."""

    args: argparse.Namespace
    env: RankEnv
    data: Data
    epoch_steps: int


def configure(argv: list[str] | None = None) -> Run:
    """The DDP script's options, checked against the run before the process group
    starts: any that does not fit stops the script in one line (09)."""
    args = parse_args(argv)
    run = prepare(args, argv, MODULE, loader_epoch_steps)
    check_accumulation(args, run.env.world_size)
    return run


def loader_epoch_steps(num_samples: int, global_batch: int, world_size: int) -> int:
    """Optimizer steps per epoch of :func:`~multigpu.ddp.train_ddp_loop`: its
    loader drops the last partial global batch (09)."""
    return num_samples // global_batch


def prepare(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    module: str,
    epoch_steps: Callable[[int, int, int], int],
    example: str = COMMAND,
) -> Run:
    """The checks a parsed script makes before its process group starts (09, 11):
    torchrun's restarts (:func:`~multigpu.ddp.cli.check_restarts`), the node's GPUs
    (:func:`~multigpu.ddp.cli.check_backend`), the data and the ranks
    (:func:`~multigpu.ddp.cli.check_run`); each stops the script in one line.
    ``epoch_steps(samples, global_batch, world_size)``: the steps of one epoch of
    the script's loop. Outside torchrun, raises :class:`NotLaunchedByTorchrunError`,
    whose message ends with ``example``, the script's command."""
    try:
        env = read_rank_env()
    except NotLaunchedByTorchrunError as error:
        text = str(error)
        if text.endswith(COMMAND) and example != COMMAND:
            text = text.removesuffix(COMMAND) + example
        raise NotLaunchedByTorchrunError(text) from None
    check_restarts(argv, module=module)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    check_backend(args.backend, local_world_size, torch.cuda.device_count(), module)
    data = load_data(args.samples)
    steps = 0  # when the batch does not split over the ranks (check_run says so)
    if args.batch_size % env.world_size == 0:
        steps = epoch_steps(len(data[0]), args.batch_size, env.world_size)
    check_run(args, env.world_size, len(data[0]), steps, module)
    return Run(args, env, data, steps)


def load_data(samples: int | None = None) -> Data:
    """The digits: the training set (its first ``samples``) and the test set (09)."""
    from multigpu.core.data import get_dataset, tensors

    X, y = tensors(get_dataset("digits", train=True))
    X_test, y_test = tensors(get_dataset("digits", train=False))
    if samples is not None:
        X, y = X[:samples], y[:samples]
    return X, y, X_test, y_test
