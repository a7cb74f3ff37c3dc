"""What both torchrun scripts of the course do around their training loop (09, 11).

``python -m multigpu.ddp`` (09) and ``python -m multigpu.snapshot`` (11) differ in
their options and their loop; the rest is here, once. :func:`run_script` takes a
script's ``configure`` (which checks every option before the process group starts:
``configure.py``) and its ``train``; it joins the group, trains, checks that every
rank ends with the same weights and turns every way a run can end into an exit
status and one line: 2 for a refusal, 1 for a rank that failed or weights that
differ, 130 for Ctrl-C (rank 0 says where the run stood).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.batches import per_rank_batch_size
from multigpu.core.train import History, TrainConfig
from multigpu.ddp.agreement import AGREE, WeightsDifferError, check_same_weights
from multigpu.ddp.cli import build_model, speaks_for_the_run
from multigpu.ddp.configure import Data, Run
from multigpu.ddp.loop import Interrupted
from multigpu.runtime.checkpoint import CheckpointMismatchError
from multigpu.runtime.rank import (
    TABLE_NAMES,
    NotEnoughGPUsError,
    NotLaunchedByTorchrunError,
    RankEnv,
    rank_table,
    setup,
)


def run_script(
    argv: list[str] | None,
    configure: Callable[[list[str] | None], Run],
    train: Callable[[Run, torch.device], History],
    refusals: tuple[type[Exception], ...] = (),
    agree: Callable[[Run, dict], None] | None = None,
) -> int:
    """A torchrun script's ``main`` (09, 11): ``configure(argv)``, join the process
    group, ``train(run, device)``, check that every rank holds the same weights
    (``agree(run, parameters)``, by default :func:`check_same_weights`); the exit
    status. 2: a wrong option or a run the script refuses (``refusals``, which every
    rank raises alike, and :class:`CheckpointMismatchError`), said once by rank 0;
    1: a rank that failed (``rank R: <its error>``) or weights that differ; 130:
    Ctrl-C, after rank 0 has said where the run stood (no traceback)."""
    finished: list[History] = []
    try:
        return _run(argv, configure, train, refusals, agree, finished)
    except KeyboardInterrupt as interrupt:  # torchrun passes Ctrl-C on to every rank
        if os.environ.get("RANK", "0") == "0":
            print(_interrupted_line(interrupt, finished), file=sys.stderr, flush=True)
        return 130


def _run(
    argv: list[str] | None,
    configure: Callable[[list[str] | None], Run],
    train: Callable[[Run, torch.device], History],
    refusals: tuple[type[Exception], ...],
    agree: Callable[[Run, dict], None] | None,
    finished: list[History],
) -> int:
    """:func:`run_script`, which appends the History to ``finished`` once trained."""
    try:
        run = configure(argv)
    except NotLaunchedByTorchrunError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rank = run.env.rank
    try:
        env, device = join_group(run.args.backend, run.args.timeout)
        rank = env.rank
        finished.append(train(run, device))
        if agree is None:
            check_same_weights(finished[-1].parameters)
        else:
            agree(run, finished[-1].parameters)
        if rank == 0:
            print(AGREE, flush=True)
    except NotEnoughGPUsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (*refusals, CheckpointMismatchError) as error:  # alike on every rank
        if speaks_for_the_run():
            print(f"error: {_one_line(error)}", file=sys.stderr, flush=True)
        return 2
    except WeightsDifferError as error:  # every rank knows; rank 0 says it
        if rank == 0:
            print(str(error), file=sys.stderr, flush=True)
        return 1
    except Exception as error:  # one line, not a traceback per rank (11)
        print(f"rank {rank}: {_one_line(error)}", file=sys.stderr, flush=True)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def join_group(backend: str, timeout: float) -> tuple[RankEnv, torch.device]:
    """:func:`multigpu.runtime.rank.setup`, with collectives that give up after
    ``timeout`` seconds (11), which also bound the ranks' meeting; nccl's group is
    joined after ``setup`` has picked this rank's GPU."""
    return setup(backend, timeout=timedelta(seconds=timeout))


def start_training(
    run: Run, device: torch.device, lr: float
) -> tuple[TrainConfig, nn.Module, Data]:
    """What both scripts train, seeded alike on every rank: the options' TrainConfig,
    ConvNet (``--sync-bn``) and the data, in float64 with ``--float64``. Rank 0
    prints the ranks, the global batch and ``lr`` (the rate the loop uses), and with
    ``--show-ranks`` what torchrun told every rank (09, 11)."""
    from multigpu.core.reproducibility import set_seed

    args, env = run.args, run.env
    X, y, X_test, y_test = run.data
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
        print(
            f"{env.world_size} ranks ({dist.get_backend()}), global batch "
            f"{config.batch_size} = {env.world_size} x {per_rank}, lr {lr:g}",
            flush=True,
        )
    if args.show_ranks:  # notebook 11: who is who on several nodes
        table = rank_table()  # a collective: every rank takes part
        if env.rank == 0:
            print(" | ".join(TABLE_NAMES), flush=True)
            for row in table:
                print(" | ".join(row[name] for name in TABLE_NAMES), flush=True)
    return config, model, (X, y, X_test, y_test)


def log_line(line: str) -> None:
    """How the scripts' loops log: a line on stdout, flushed (09)."""
    print(line, flush=True)


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
