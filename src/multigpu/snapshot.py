"""Snapshots that let a DDP run survive a dead rank and resume mid-epoch (11).

Taught in ``notebooks/11_fault_tolerance.ipynb``. A *snapshot* is a checkpoint
written often (every ``every`` optimizer steps, not once per epoch) that holds
everything the next step depends on, so that a run restarted from it continues
with exactly the numbers the uninterrupted run would have used next:

- the model and the optimizer (momentum buffers included);
- where the run stands: ``epoch``, ``step`` (optimizer steps done in that epoch)
  and ``global_step`` (steps done in all) (:class:`Position`);
- the sampler's state: its seed, the number of ranks and the samples each rank has
  already taken this epoch (:class:`ResumableSampler` skips them on resuming);
- every rank's random number generators (torch, NumPy, Python; CUDA where there is
  one) and its losses of the epoch so far, gathered to rank 0 with one collective,
  since each rank draws its own random numbers (dropout, augmentation).

Rank 0 writes it atomically (``checkpoint.write_atomically``: a killed save leaves
the previous snapshot, never half a file); every rank reads it at start with
``map_location`` (:func:`load_snapshot`). The training loop that does this is
:func:`train_with_snapshots`, which ``python -m multigpu.ddp --snapshot DIR`` runs
under torchrun::

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 -m multigpu.ddp \\
        --snapshot DIR --snapshot-every 5 --kill-rank 1 --kill-at-step 13

``--kill-rank R --kill-at-step S`` injects a fault: rank R kills itself with
SIGKILL before step S, once (:class:`Fault`; a file in the snapshot folder
remembers that it fired). Every rank that fails, dies or resumes notes the time in
``DIR/events.jsonl`` (:func:`record_event`), from which :func:`restart_figures`
computes how long the restart took and how many steps were lost.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from multigpu.allreduce_sgd import per_rank_batch_size
from multigpu.core.checks import check_number, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.ddp import evaluate_distributed, rank_device, reduce_value, wrap
from multigpu.runtime.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    unwrap,
)

SNAPSHOT_FILE = "snapshot.pt"  # the snapshot's name inside its folder
EVENTS_FILE = "events.jsonl"  # one JSON object per line: what happened, and when
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun: 0, then 1, 2, ...


class SnapshotMismatchError(CheckpointError):
    """A snapshot written by a run that does not fit this one: another number of
    ranks, or another global batch (11)."""


@dataclass(frozen=True)
class Position:
    """Where a run stands: the next step is step ``step`` of epoch ``epoch`` (11)."""

    epoch: int = 0  # 0-based epoch the next step belongs to
    step: int = 0  # optimizer steps already done in that epoch
    global_step: int = 0  # optimizer steps done in all epochs


@dataclass(frozen=True)
class Fault:
    """Rank ``rank`` kills itself with SIGKILL before ``step``; once (11)."""

    rank: int
    step: int

    def marker(self, folder: str | os.PathLike) -> Path:
        """The file that says this fault has fired: it is in the snapshot folder,
        so a restarted rank finds it and does not fire again."""
        return Path(folder) / f"fault_rank{self.rank}_step{self.step}.fired"


# ----------------------------------------------------------------------------------
# The sampler


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` that can start part-way through an epoch (11).

    ``set_epoch(epoch, start)`` gives this epoch's shuffle (seeded by
    ``seed + epoch`` as usual) without its first ``start`` indices: the ones this
    rank has already trained on. Every rank takes the same number of samples per
    step, so ``start`` is ``step × per-rank batch`` on every rank.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0  # indices of this epoch already used by this rank

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle for ``epoch`` and skip the first ``start`` indices of this rank."""
        if not 0 <= start <= self.num_samples:
            raise ValueError(
                f"start={start} is outside this rank's {self.num_samples} indices "
                "per epoch. Pass the samples already used this epoch, from 0 to "
                f"{self.num_samples}."
            )
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start

    def state_dict(self) -> dict[str, int]:
        """What a snapshot needs to rebuild this sampler's order (plain ints)."""
        return {
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "epoch": self.epoch,
            "start": self.start,
        }


# ----------------------------------------------------------------------------------
# Random number generators


def rng_state() -> dict[str, Any]:
    """This process's random number generators as plain data: torch, NumPy, Python,
    and every CUDA device where there are some (11)."""
    numpy_state = np.random.get_state(legacy=False)
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`rng_state` returned (11)."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": saved["bit_generator"],
            "state": {
                "key": saved["key"].numpy().astype(np.uint32),
                "pos": saved["pos"],
            },
            "has_gauss": saved["has_gauss"],
            "gauss": saved["gauss"],
        }
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------
# Saving and loading


def save_snapshot(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    position: Position,
    sampler: ResumableSampler,
    rank_state: Mapping[str, Any] | None = None,
) -> None:
    """Every rank calls it; rank 0 writes the snapshot atomically (11).

    ``rank_state``: what only this rank knows (its losses of the epoch so far); it
    is gathered from every rank together with their random number generators, with
    one ``all_gather_object``, so this is a collective. No barrier follows: nobody
    reads the file before the next start.
    """
    mine = {"rng": rng_state(), **dict(rank_state or {})}
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    ranks: list[Any] = [mine]
    if world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, mine)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    save_checkpoint(
        path,
        model,
        optimizer,
        epoch=position.epoch,
        position=position,
        sampler=sampler.state_dict(),
        ranks=ranks,
        world_size=world_size,
    )


def load_snapshot(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: ResumableSampler,
    device: torch.device | str = "cpu",
) -> tuple[Position, dict[str, Any]]:
    """Every rank loads the snapshot (tensors to ``device`` with ``map_location``),
    puts back its own random number generators, and gets (where to go on, what it
    saved in ``rank_state``); ``(Position(), {})`` when there is no snapshot (11).

    A snapshot from another number of ranks or another sampler seed raises
    :class:`SnapshotMismatchError`: its sample order would not continue this run's.
    """
    if not Path(path).exists():
        return Position(), {}
    snapshot = load_checkpoint(path, model, optimizer, map_location=device)
    saved = snapshot["sampler"]
    here = sampler.state_dict()
    for key, meaning in (("num_replicas", "ranks"), ("seed", "sampler seed")):
        if saved[key] != here[key]:
            raise SnapshotMismatchError(
                f"{Path(path).name} was written by a run with {saved[key]} as its "
                f"{meaning}, and this run has {here[key]}, so its sample order would "
                f"not continue this one. Resume with the same {meaning}, or start "
                "afresh in a new snapshot folder."
            )
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = dict(snapshot["ranks"][rank])
    set_rng_state(mine.pop("rng"))
    return snapshot["position"], mine


# ----------------------------------------------------------------------------------
# Events: what happened, and when, for measuring a restart


def record_event(folder: str | os.PathLike, event: str, **details: Any) -> None:
    """Append ``{"event": ..., "time": ..., "restart": ..., **details}`` as one line
    to ``folder/events.jsonl`` (11). A short append is atomic, so ranks can share
    the file."""
    entry = {
        "event": event,
        "time": time.time(),
        "restart": int(os.environ.get(RESTART_COUNT, "0")),
        **details,
    }
    with open(Path(folder) / EVENTS_FILE, "a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")


def read_events(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The events recorded in ``folder``, in the order they were written (11)."""
    path = Path(folder) / EVENTS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def restart_figures(
    folder: str | os.PathLike, killed_at: float | None = None
) -> dict[str, float]:
    """How the first restart went, from the events of ``folder`` (11):
    ``detect_s`` (from the kill until a surviving rank's collective failed, or
    torchrun stopped it),
    ``restart_s`` (until the new processes started), ``resume_s`` (until they had
    loaded the snapshot and were ready to train), all in seconds, and
    ``steps_lost`` (steps done before the kill and done again after it).

    ``killed_at``: when the rank was killed (``time.time()``), for a kill from
    outside; an injected :class:`Fault` records it itself.
    """
    events = read_events(folder)
    if killed_at is None:
        kills = [e for e in events if e["event"] == "kill"]
        if not kills:
            raise ValueError(
                "No kill is recorded in this folder. Pass killed_at=time.time() "
                "taken when you killed the rank."
            )
        killed_at = kills[0]["time"]

    def first(event: str, restarted: bool) -> dict[str, Any]:
        for entry in events:
            if entry["event"] == event and entry["time"] >= killed_at:
                if not restarted or entry["restart"] > 0:
                    return entry
        raise ValueError(f"No {event!r} event after the kill: did the run restart?")

    resumed = first("resumed", restarted=True)
    done_before = [
        e["global_step"] for e in events if e["event"] == "step" and e["restart"] == 0
    ]
    return {
        "detect_s": first("failed", restarted=False)["time"] - killed_at,
        "restart_s": first("started", restarted=True)["time"] - killed_at,
        "resume_s": resumed["time"] - killed_at,
        "steps_lost": max(done_before, default=0) - resumed["global_step"],
    }


def fire(fault: Fault | None, folder: str | os.PathLike, rank: int, step: int) -> None:
    """If ``fault`` is due on this rank at this step and has not fired before: note
    it in the folder, then SIGKILL this process (no clean-up, no message, as when
    a machine dies or the out-of-memory killer strikes) (11)."""
    if fault is None or fault.rank != rank or fault.step != step:
        return
    marker = fault.marker(folder)
    if marker.exists():
        return
    marker.write_text(f"rank {rank} killed itself before step {step}\n")
    record_event(folder, "kill", rank=rank, step=step)
    print(f"rank {rank}: SIGKILL to itself before step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------
# The training loop


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

    Like :func:`multigpu.ddp.train` (SGD with momentum, ``config.batch_size`` the
    global batch, the same sample order), and also: ``fault`` kills a rank once
    (:func:`fire`); ``step_delay`` seconds of sleep per step slow the run down so
    that a rank can be killed from outside while it trains; ``stop_after_steps``
    ends the run early, as an interruption would. The returned History holds the
    epochs and steps trained by this launch only. Rank 0 calls ``log``.
    ``save`` and ``load`` replace :func:`save_snapshot` and :func:`load_snapshot`
    (same arguments), for an exercise that writes them.
    """
    save = save_snapshot if save is None else save
    load = load_snapshot if load is None else load
    check_positive_int("every", every, "Snapshot every 1 or more steps, e.g. every=5.")
    check_number("step_delay", step_delay, "Pass 0 for no delay.", allow_zero=True)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
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
    loader = DataLoader(
        TensorDataset(X, y), batch_size=per_rank, sampler=sampler, drop_last=True
    )
    steps_per_epoch = sampler.num_samples // per_rank
    position, mine = load(folder / SNAPSHOT_FILE, model, optimizer, sampler, device)
    if main:
        record_event(folder, "resumed", global_step=position.global_step)
        if log and position.global_step:
            log(
                f"restart {restart}: resumed from the snapshot of step "
                f"{position.global_step} (epoch {position.epoch + 1}, step "
                f"{position.step} of {steps_per_epoch})"
            )
        elif log:
            log(f"restart {restart}: no snapshot yet, starting at step 0")
    history = History(rank=rank, world_size=world_size)
    global_step = position.global_step
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
                    if main and log:
                        log(f"snapshot of step {global_step} saved")
            mean = torch.tensor(sum(losses) / len(losses), dtype=torch.float64)
            history.train_loss.append(reduce_value(mean).item())  # over all ranks
            line = f"epoch {epoch + 1}/{config.epochs}: "
            line += f"train loss {history.train_loss[-1]:.4f}"
            if X_test is not None and y_test is not None:
                test_loss, accuracy = evaluate_distributed(model, X_test, y_test)
                history.test_loss.append(test_loss)
                history.test_accuracy.append(accuracy)
                line += f", test loss {test_loss:.4f}, test accuracy {accuracy:.4f}"
            if main and log:
                log(line)
        end = Position(config.epochs, 0, global_step)
        save(folder / SNAPSHOT_FILE, model, optimizer, end, sampler, {"losses": []})
    except Exception as error:  # a peer died or hung: note when, then fail
        record_event(folder, "failed", rank=rank, error=type(error).__name__)
        raise
    finally:
        restore()
    return _finish(history, model)


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


def snapshot_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    folder: str,
    every: int,
    stop_after_steps: int | None = None,
    module: str | None = None,
) -> History:
    """What each rank runs when a notebook starts :func:`train_with_snapshots`
    through ``launch.spawn`` (11). ``module``: the name of a module whose
    ``save_snapshot`` and ``load_snapshot`` replace this module's (an exercise)."""
    functions = {}
    if module is not None:
        written = importlib.import_module(module)
        functions = {"save": written.save_snapshot, "load": written.load_snapshot}
    return train_with_snapshots(
        model,
        X,
        y,
        config,
        folder,
        every,
        stop_after_steps=stop_after_steps,
        log=None,
        **functions,
    )
