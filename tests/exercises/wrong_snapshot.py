"""Snapshot save/load pairs for 11's checker: a right one and the mistakes learners
make. The ranks import them, so they live in a module."""

from __future__ import annotations

import torch
import torch.distributed as dist

from multigpu.runtime.checkpoint import load_checkpoint, save_checkpoint
from multigpu.snapshot import Position, rng_state, set_rng_state


def save_right(path, model, optimizer, position, sampler, rank_state):
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"rng": rng_state(), **rank_state})
    if dist.get_rank() == 0:
        save_checkpoint(
            path, model, optimizer, position=position, sampler=sampler.state_dict(),
            ranks=ranks,
        )  # fmt: skip


def load_right(path, model, optimizer, sampler, device):
    if not path.exists():
        return Position(), {}
    saved = load_checkpoint(path, model, optimizer, map_location=device)
    mine = dict(saved["ranks"][dist.get_rank()])
    set_rng_state(mine.pop("rng"))
    return saved["position"], mine


def save_no_rng(path, model, optimizer, position, sampler, rank_state):
    """11 ex. 1's old solution: no generators at all."""
    if dist.get_rank() == 0:
        save_checkpoint(
            path, model, optimizer, position=position, losses=rank_state["losses"]
        )


def load_no_rng(path, model, optimizer, sampler, device):
    if not path.exists():
        return Position(), {}
    saved = load_checkpoint(path, model, optimizer, map_location=device)
    return saved["position"], {"losses": saved["losses"]}


def save_rank0_rng(path, model, optimizer, position, sampler, rank_state):
    """Only rank 0 writes, so only rank 0's generators get in."""
    if dist.get_rank() == 0:
        save_checkpoint(
            path, model, optimizer, position=position, rng=rng_state(),
            losses=rank_state["losses"],
        )  # fmt: skip


def load_rank0_rng(path, model, optimizer, sampler, device):
    if not path.exists():
        return Position(), {}
    saved = load_checkpoint(path, model, optimizer, map_location=device)
    set_rng_state(saved["rng"])
    return saved["position"], {"losses": saved["losses"]}


def load_epoch_start(path, model, optimizer, sampler, device):
    """Resumes every epoch from its start (11 ex. 2): the sampler's place is lost."""
    position, mine = load_right(path, model, optimizer, sampler, device)
    return Position(position.epoch, 0, position.global_step - position.step), mine


def save_no_optimizer(path, model, optimizer, position, sampler, rank_state):
    """The optimizer left out: its momentum is lost."""
    save_right(path, model, None, position, sampler, rank_state)


def load_no_optimizer(path, model, optimizer, sampler, device):
    return load_right(path, model, None, sampler, device)


def save_in_place(path, model, optimizer, position, sampler, rank_state):
    """Everything, but written with torch.save straight to the path: not atomic."""
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {"rng": rng_state(), **rank_state})
    if dist.get_rank() == 0:
        state = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "position": position,
            "ranks": ranks,
        }
        torch.save(state, path)


def load_in_place(path, model, optimizer, sampler, device):
    if not path.exists():
        return Position(), {}
    saved = torch.load(path, map_location=device, weights_only=False)
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    mine = dict(saved["ranks"][dist.get_rank()])
    set_rng_state(mine.pop("rng"))
    return saved["position"], mine


def save_rank0_gathers(path, model, optimizer, position, sampler, rank_state):
    """The gather inside `if rank == 0:`: rank 1 never joins it."""
    if dist.get_rank() == 0:
        save_right(path, model, optimizer, position, sampler, rank_state)


def load_no_rank_state(path, model, optimizer, sampler, device):
    """Everything but this rank's own state: returns {} for it, so the resumed
    epoch's mean loss covers only the steps after the resume."""
    position, _ = load_right(path, model, optimizer, sampler, device)
    return position, {}
