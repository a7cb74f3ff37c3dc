"""Saving a snapshot (rank 0 writes it atomically) and loading it on every rank (11)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.ddp.checkpoints import changed_setting, optimizer_settings
from multigpu.runtime.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from multigpu.snapshot.rng import rng_state, set_rng_state
from multigpu.snapshot.sampler import Position, ResumableSampler

SNAPSHOT_FILE = "snapshot.pt"  # the snapshot's name inside its folder


class SnapshotMismatchError(CheckpointError):
    """A snapshot written by a run that does not fit this one: another number of
    ranks, sampler seed, number of samples, global batch, or optimizer settings
    (``lr``, ``momentum``) (11)."""


def save_snapshot(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    position: Position,
    sampler: ResumableSampler,
    rank_state: Mapping[str, Any] | None = None,
    *,
    global_batch: int | None = None,
) -> None:
    """Every rank calls it; rank 0 writes the snapshot atomically (11).

    ``rank_state``: what only this rank knows (its losses of the epoch so far); it
    is gathered from every rank together with their random number generators, with
    one ``all_gather_object``, so this is a collective. No barrier follows: nobody
    reads the file before the next start. ``global_batch`` (the samples of one
    step, all ranks together) is recorded so that a resumed run can check it.
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
        samples=len(sampler.dataset),
        global_batch=global_batch,
    )


def load_snapshot(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sampler: ResumableSampler,
    device: torch.device | str = "cpu",
    *,
    global_batch: int | None = None,
) -> tuple[Position, dict[str, Any]]:
    """Every rank loads the snapshot (tensors to ``device`` with ``map_location``),
    puts back its own random number generators, and gets (where to go on, what it
    saved in ``rank_state``); ``(Position(), {})`` when there is no snapshot (11).

    A snapshot from another number of ranks, sampler seed, number of samples or
    ``global_batch`` raises :class:`SnapshotMismatchError`: its sample order would
    not continue this run's. So does one whose optimizer had another ``lr`` or
    ``momentum`` than ``optimizer`` (loading its state would silently put the saved
    values back). A setting the snapshot or this call leaves out (None, or a
    snapshot saved before it was recorded) is not compared.
    """
    if not Path(path).exists():
        return Position(), {}
    asked = optimizer_settings(optimizer)
    snapshot = load_checkpoint(path, model, optimizer, map_location=device)
    saved, here = snapshot["sampler"], sampler.state_dict()
    order = "its sample order would not continue this one"
    settings = [
        ("ranks", saved["num_replicas"], here["num_replicas"], order),
        ("sampler seed", saved["seed"], here["seed"], order),
        ("number of samples", snapshot.get("samples"), len(sampler.dataset), order),
        ("global batch", snapshot.get("global_batch"), global_batch, order),
    ]
    changed = changed_setting(asked, optimizer_settings(optimizer))
    if changed is not None:  # load_state_dict put back the saved lr or momentum
        name, before, now = changed
        why = f"the resumed run would train with {before}, not {now}"
        settings.append((f"optimizer's {name}", before, now, why))
    for meaning, before, now, why in settings:
        if before is not None and now is not None and before != now:
            raise SnapshotMismatchError(
                f"{Path(path).name} was written by a run with {before} as its "
                f"{meaning}, and this run has {now}, so {why}. Resume with the "
                f"same {meaning}, or start afresh in a new snapshot folder."
            )
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = dict(snapshot["ranks"][rank])
    set_rng_state(mine.pop("rng"))
    return snapshot["position"], mine
