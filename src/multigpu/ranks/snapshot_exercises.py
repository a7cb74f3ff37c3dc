"""What the ranks run when 11's checker tries a learner's snapshot save and load: an
uninterrupted run, a run stopped mid-epoch and its resumption, all watched (11)."""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from multigpu.core.train import TrainConfig, cpu_state_dict
from multigpu.runtime.checkpoint import unwrap
from multigpu.snapshot import rng_state, train_with_snapshots

PROBE_SEED = 100  # each rank's generators start from PROBE_SEED + rank
PROBE_EVERY = 4  # a snapshot every 4 steps: at steps 4 and 8 before the stop
PROBE_STOP = 9  # the stopped run ends after step 9 (epoch 2, step 3 of 6)
PROBE_CONFIG = TrainConfig(epochs=2, batch_size=8, lr=0.05, momentum=0.9, seed=0)


class NoisyNet(nn.Module):
    """A linear classifier of 8 features into 4 classes that adds NumPy noise to
    its inputs while training, as an augmentation drawn from ``np.random`` would:
    each rank's numbers depend on its own generator (11)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, 8) -> (batch, 4)
        if self.training:
            noise = np.random.normal(0.0, 0.5, size=tuple(x.shape))
            x = x + torch.from_numpy(noise).to(x.dtype)
        return self.linear(x)


def probe_problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The checker's model and data: 48 samples, 6 steps of 8 per epoch (11)."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(48, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 4, (48,), generator=generator)
    torch.manual_seed(0)
    return NoisyNet().double(), X, y


def _fresh_process(rank: int) -> None:
    """Seed this rank's generators as a newly started process of it would."""
    torch.manual_seed(PROBE_SEED + rank)
    np.random.seed(PROBE_SEED + rank)
    random.seed(PROBE_SEED + rank)


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The momentum buffers, in parameter order (empty before the first step)."""
    state = optimizer.state_dict()["state"]
    return [state[i]["momentum_buffer"].clone() for i in sorted(state)]


def snapshot_probe_rank(
    rank: int, world_size: int, save: Callable, load: Callable, folder: str
) -> dict[str, Any]:
    """Train :func:`probe_problem` three times on these ranks (11): without a stop
    (the reference snapshots), then with the learner's ``save`` and ``load``,
    stopped after step ``PROBE_STOP``, then resumed with them from that folder.

    Before each run every generator is seeded as a new process would be, so the
    resumed run knows only what ``load`` put back. Reports what this rank's
    ``save`` was given at the last snapshot (generators, position, weights,
    momentum, its own state) and what ``load`` restored, whether rank 0's save
    rewrote the file in place (not atomic), and the final weights and last epoch's
    mean loss of both runs."""
    model, X, y = probe_problem()
    saved: dict[str, Any] = {"in_place": False}
    restored: dict[str, Any] = {}

    def watched_save(path: Any, model: nn.Module, optimizer: Any, *args: Any) -> None:
        saved.update(
            rng=rng_state(),
            position=args[0],
            weights=cpu_state_dict(unwrap(model)),
            momentum=_optimizer_state(optimizer),
            rank_state=copy.deepcopy(dict(args[2])),  # the loop appends to it later
        )
        before = os.stat(path).st_ino if rank == 0 and Path(path).exists() else None
        save(path, model, optimizer, *args)
        if before is not None and Path(path).exists():
            saved["in_place"] |= os.stat(path).st_ino == before

    def watched_load(path: Any, model: nn.Module, optimizer: Any, *args: Any) -> Any:
        position, mine = load(path, model, optimizer, *args)
        restored.update(
            rng=rng_state(),
            position=position,
            weights=cpu_state_dict(unwrap(model)),
            momentum=_optimizer_state(optimizer),
            rank_state=copy.deepcopy(mine),
        )
        return position, mine

    common = {"log": None, "every": PROBE_EVERY}
    _fresh_process(rank)
    whole = train_with_snapshots(
        model, X, y, PROBE_CONFIG, f"{folder}/uninterrupted", **common
    )
    _fresh_process(rank)
    stopped = f"{folder}/stopped"
    train_with_snapshots(
        model, X, y, PROBE_CONFIG, stopped, stop_after_steps=PROBE_STOP,
        save=watched_save, load=load, **common,
    )  # fmt: skip
    _fresh_process(rank)
    resumed = train_with_snapshots(
        model, X, y, PROBE_CONFIG, stopped, save=save, load=watched_load, **common
    )
    return {
        "saved": saved,
        "restored": restored,
        "uninterrupted": whole.parameters,
        "resumed": resumed.parameters,
        "uninterrupted_loss": whole.train_loss[-1],
        "resumed_loss": resumed.train_loss[-1],
        "resumed_steps": len(resumed.step_loss),
    }
