"""The training loop that snapshots every few steps and resumes from the snapshot,
mid-epoch if need be (11)."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from multigpu.core.batches import per_rank_batch_size
from multigpu.core.checks import check_number, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.ddp import wrap
from multigpu.ddp.loop import Interrupted, end_epoch
from multigpu.runtime.checkpoint import unwrap
from multigpu.runtime.rank import rank_device
from multigpu.snapshot.events import RESTART_COUNT, record_event
from multigpu.snapshot.files import SNAPSHOT_FILE, load_snapshot, save_snapshot
from multigpu.snapshot.injection import Fault, fire
from multigpu.snapshot.lock import (
    FolderLock,
    SnapshotInUseError,
    describe_owner,
    lock_folder,
    owner_record,
    same_run,
)
from multigpu.snapshot.sampler import Position, ResumableSampler


def train_with_snapshots(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    folder: str | os.PathLike,
    every: int = 5,
    *,
    X_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    fault: Fault | None = None,
    step_delay: float = 0.0,
    stop_after_steps: int | None = None,
    log: Callable[[str], None] | None = print,
    save: Callable[..., None] | None = None,
    load: Callable[..., tuple[Position, dict[str, Any]]] | None = None,
) -> History:
    """DDP training in a running process group that snapshots every ``every`` steps
    into ``folder`` and resumes from the snapshot there, mid-epoch if need be (11).

    Like :func:`multigpu.ddp.train_ddp_loop` (SGD with momentum,
    ``config.batch_size`` the global batch, the same sample order), and also:
    ``fault`` kills a rank once (:func:`fire`); ``step_delay`` seconds of sleep per
    step slow the run down so that a rank can be killed from outside while it
    trains; ``stop_after_steps`` ends the run early, as an interruption would. The
    returned History holds the epochs and steps trained by this launch only. Rank 0
    calls ``log``. ``save`` and ``load`` replace :func:`save_snapshot` and
    :func:`load_snapshot` (same arguments), for an exercise that writes them.

    Rank 0 holds the folder's lock while the run trains (:func:`lock_folder`):
    another live run's lock raises :class:`SnapshotInUseError` on every rank. A
    snapshot of a finished run (as many epochs done as ``config.epochs``, or more)
    trains nothing, and rank 0 says so. Ctrl-C raises :class:`Interrupted`, whose
    text says at which step and which snapshot a rerun resumes from.
    """
    if save is None:  # the reference records the sample position's settings
        save = partial(save_snapshot, global_batch=config.batch_size)
    if load is None:  # ... and refuses a snapshot written with others
        load = partial(load_snapshot, global_batch=config.batch_size)
    check_positive_int("every", every, "Snapshot every 1 or more steps, e.g. every=5.")
    check_number("step_delay", step_delay, "Pass 0 for no delay.", allow_zero=True)
    world_size = dist.get_world_size()
    steps_per_epoch = snapshot_epoch_steps(len(X), config.batch_size, world_size)
    if steps_per_epoch == 0:
        raise ValueError(
            f"The global batch of {config.batch_size} is larger than the {len(X)} "
            f"samples on {world_size} ranks, so not even one full batch fits. Use a "
            f"global batch of at most {len(X)}."
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = _take_folder(folder, log)  # one live run per folder
    try:
        return _train(
            model,
            X,
            y,
            config,
            folder,
            every,
            X_test,
            y_test,
            fault,
            step_delay,
            stop_after_steps,
            log,
            save,
            load,
        )
    finally:
        if lock is not None:
            lock.release()


def _train(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    folder: Path,
    every: int,
    X_test: torch.Tensor | None,
    y_test: torch.Tensor | None,
    fault: Fault | None,
    step_delay: float,
    stop_after_steps: int | None,
    log: Callable[[str], None] | None,
    save: Callable[..., None],
    load: Callable[..., tuple[Position, dict[str, Any]]],
) -> History:
    """:func:`train_with_snapshots` once its arguments are checked and rank 0 holds
    the folder's lock."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    main = rank == 0
    restart = int(os.environ.get(RESTART_COUNT, "0"))
    if main:
        record_event(folder, "started")
    model = wrap(copy.deepcopy(model), device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    per_rank = per_rank_batch_size(config.batch_size, world_size)
    sampler = ResumableSampler(
        TensorDataset(X, y), num_replicas=world_size, rank=rank, seed=config.seed
    )
    loader = DataLoader(  # its own generator: iterating it after a resume draws
        TensorDataset(X, y),  # no number from the restored global one (dropout)
        batch_size=per_rank,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator(),
    )
    steps_per_epoch = snapshot_epoch_steps(len(X), config.batch_size, world_size)
    position, mine = load(folder / SNAPSHOT_FILE, model, optimizer, sampler, device)
    if main:
        record_event(folder, "resumed", global_step=position.global_step)
        if log:
            log(_start_line(restart, position, steps_per_epoch, config.epochs))
    history = History(rank=rank, world_size=world_size)
    if position.epoch >= config.epochs:  # a finished run: nothing left to train
        return _finish(history, model)
    global_step = position.global_step
    saved = position.global_step or None  # the step of the last snapshot, if any
    restore = _note_termination(folder, rank)
    try:
        for epoch in range(position.epoch, config.epochs):
            first = epoch == position.epoch
            start_step = position.step if first else 0
            sampler.set_epoch(epoch, start=start_step * per_rank)
            losses = list(mine.get("losses", [])) if first else []
            for step, (xb, yb) in enumerate(loader, start=start_step):
                if stop_after_steps is not None and (
                    global_step - position.global_step >= stop_after_steps
                ):
                    return _finish(history, model)
                fire(fault, folder, rank, global_step)
                xb, yb = (
                    xb.to(device),
                    yb.to(device),
                )  # (per_rank, C, H, W), (per_rank,)
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward()  # DDP averages the gradients over the ranks here
                optimizer.step()
                losses.append(loss.item())
                history.step_loss.append(losses[-1])
                global_step += 1
                if step_delay:
                    time.sleep(step_delay)
                if main:
                    record_event(folder, "step", global_step=global_step)
                if global_step % every == 0:
                    done = Position(epoch, step + 1, global_step)
                    if step + 1 == steps_per_epoch:  # the next step opens an epoch
                        done = Position(epoch + 1, 0, global_step)
                    state = {"losses": losses if done.step else []}
                    save(folder / SNAPSHOT_FILE, model, optimizer, done, sampler, state)
                    saved = global_step
                    if main and log:
                        log(f"snapshot of step {global_step} saved")
            line = end_epoch(
                history, model, losses, epoch, config.epochs, X_test, y_test
            )
            if main and log:
                log(line)
        end = Position(config.epochs, 0, global_step)
        save(folder / SNAPSHOT_FILE, model, optimizer, end, sampler, {"losses": []})
    except KeyboardInterrupt:  # Ctrl-C: one line for the script, not a traceback
        raise Interrupted(_interrupted_line(global_step, saved)) from None
    except Exception as error:  # a peer died or hung: note when, then fail
        record_event(folder, "failed", rank=rank, error=type(error).__name__)
        raise
    finally:
        restore()
    return _finish(history, model)


def _start_line(
    restart: int, position: Position, steps_per_epoch: int, epochs: int
) -> str:
    """What rank 0 says as the run starts: from where, or that it is complete (11)."""
    if position.epoch >= epochs:
        return (
            f"restart {restart}: the run is already complete: its snapshot of step "
            f"{position.global_step} ends epoch {position.epoch}, and this run asks "
            f"for {epochs} epoch(s), so there is nothing to train. Use a new "
            "snapshot folder to train again, or more epochs to train on."
        )
    if position.global_step:
        return (
            f"restart {restart}: resumed from the snapshot of step "
            f"{position.global_step} (epoch {position.epoch + 1}, step "
            f"{position.step} of {steps_per_epoch})"
        )
    return f"restart {restart}: no snapshot yet, starting at step 0"


def _interrupted_line(global_step: int, saved: int | None) -> str:
    """What the script prints once for a Ctrl-C: where the run stood, what is kept."""
    if saved is None:
        return (
            f"interrupted at step {global_step}; no snapshot was saved yet, so a "
            "rerun starts again at step 0"
        )
    return (
        f"interrupted at step {global_step}; the last snapshot is step {saved}, "
        "which a rerun resumes from"
    )


def _take_folder(folder: Path, log: Callable[[str], None] | None) -> FolderLock | None:
    """Rank 0 takes the folder's lock and tells every rank how it went (a
    collective): another live run's lock raises :class:`SnapshotInUseError` on
    every rank, before anything in the folder is read or written (11). A file
    system that cannot lock (some network ones) is said once, and the run goes on."""
    lock, refused, note = None, [None], None
    if dist.get_rank() == 0:
        try:
            lock = lock_folder(folder)
        except SnapshotInUseError as error:
            refused = [str(error)]
        except OSError as error:
            note = f"cannot lock the snapshot folder ({error.strerror or error})"
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(refused, src=0)
    if refused[0] is not None:
        raise SnapshotInUseError(refused[0])
    restart = int(os.environ.get(RESTART_COUNT, "0"))
    if note and log:
        log(f"restart {restart}: {note}, so a second run in it would not be stopped")
    previous = lock.previous if lock is not None else None
    if previous and log and not same_run(previous, owner_record()):
        log(
            f"restart {restart}: the snapshot folder's lock was left by a run that "
            f"ended without letting it go (killed?): {describe_owner(previous)}. "
            "Taken over."
        )
    return lock


def snapshot_epoch_steps(num_samples: int, global_batch: int, world_size: int) -> int:
    """Optimizer steps per epoch of :func:`train_with_snapshots`: each rank's
    ``ceil(num_samples / world_size)`` indices (the sampler pads with repeats) in
    batches of ``global_batch / world_size``, the last partial one dropped (11)."""
    per_rank = per_rank_batch_size(global_batch, world_size)
    return -(-num_samples // world_size) // per_rank


def _note_termination(folder: Path, rank: int) -> Callable[[], None]:
    """Make a SIGTERM (what torchrun sends the surviving ranks when one died, maybe
    before their next collective has failed) note a "failed" event, then end the
    process by SIGTERM as before. Returns what puts the previous handler back; only
    the main thread can set one, elsewhere nothing changes (11)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def terminated(signum: int, frame: Any) -> None:
        record_event(folder, "failed", rank=rank, error="SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminated)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _finish(history: History, model: nn.Module) -> History:
    history.parameters = cpu_state_dict(unwrap(model))
    return history
