"""The ranks of notebook 19 and the launchers that start them (19).

:func:`grid_rank` trains the tiny GPT on this rank's part of each grid in turn,
by hand (:func:`~multigpu.gpt4d.hand.train_4d`) or with PyTorch's APIs
(:func:`~multigpu.gpt4d.torch_api.torch_train_4d`), or both, in one world (every
grid makes its own groups), and compares what the rank holds with the one-process
reference cut the same way, and the two versions with each other;
:func:`run_grids` starts it once for many (grid, dtype) cases.
:func:`groups_rank` reports this rank's coordinates and group members
(:func:`run_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from multigpu.gpt4d.config import GPTConfig
from multigpu.gpt4d.grid import Grid, build_groups
from multigpu.gpt4d.hand import reference_shards, train_4d
from multigpu.gpt4d.model import make_token_batches, one_process_training
from multigpu.runtime.launch import SLOW_TIMEOUT_S, spawn

__all__ = [
    "VERSIONS",
    "Case",
    "GridRun",
    "grid_rank",
    "groups_rank",
    "run_grids",
    "run_groups",
    "run_schedules",
    "schedules_rank",
]

VERSIONS = ("hand", "torch", "both")


@dataclass(frozen=True)
class GridRun:
    """One case on one rank: the largest parameter difference from one process
    (and, for "both", between the two versions), the loss per step (None off the
    last stage) and one process's (19)."""

    grid: Grid
    dtype: str
    version: str
    rank: int
    coords: dict[str, int]
    max_diff: float
    losses: tuple[float | None, ...]
    reference_losses: tuple[float, ...]
    versions_diff: float | None = None


def _largest(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in b)


Case = tuple[Grid, str, str, tuple[int, ...]]
"""(grid, dtype name, version, batch sizes): one training run of :func:`grid_rank`."""


def grid_rank(
    rank: int,
    world_size: int,
    cases: Sequence[Case],
    config: GPTConfig,
    microbatches: int = 2,
) -> list[GridRun]:
    """Rank function: each case trained by hand, with PyTorch's APIs, or "both",
    compared with one process (and the two versions with each other) (19)."""
    from multigpu.gpt4d.torch_api import torch_train_4d

    runs = []
    for grid, name, version, sizes in cases:
        batches = make_token_batches(config, sizes)
        dtype = getattr(torch, name)
        reference, ref_losses = one_process_training(config, batches, dtype)
        between = None
        if version in ("hand", "both"):
            groups = build_groups(grid, rank)
            stage, losses = train_4d(
                config, groups, batches, dtype, microbatches=microbatches
            )
            held = dict(stage.named_parameters())
            diff = _largest(held, reference_shards(reference, stage))
        if version in ("torch", "both"):
            full, losses = torch_train_4d(
                rank, grid, config, batches, dtype, microbatches=microbatches
            )
            diff = _largest(full, {k: reference[k] for k in full})
            if version == "both":
                between = _largest(held, reference_shards(full, stage))
        runs.append(
            GridRun(
                grid,
                name,
                version,
                rank,
                grid.coords(rank),
                diff,
                tuple(losses),
                tuple(ref_losses),
                between,
            )
        )
    return runs


def run_grids(
    cases: Sequence[Case],
    config: GPTConfig | None = None,
    microbatches: int = 2,
    timeout: float = SLOW_TIMEOUT_S,
) -> list[GridRun]:
    """Start :func:`grid_rank` once for every case (all grids of one size); every
    rank's runs, case by case (19)."""
    config = GPTConfig() if config is None else config
    for _, _, version, _ in cases:
        if version not in VERSIONS:
            raise ValueError(f"Unknown version {version!r}; choose one of {VERSIONS}.")
    world_size = cases[0][0].world_size
    if any(case[0].world_size != world_size for case in cases):
        raise ValueError(
            "All grids of one launch need the same number of ranks; launch each "
            "size apart."
        )
    per_rank = spawn(
        grid_rank, world_size, list(cases), config, microbatches, timeout=timeout
    )
    return [run for runs in zip(*per_rank) for run in runs]


def groups_rank(rank: int, world_size: int, grid: Grid) -> dict:
    """Rank function: this rank's coordinates and the members of its groups (19)."""
    groups = build_groups(grid, rank)
    return {"rank": rank, "coords": groups.coords, "members": groups.members}


def run_groups(grid: Grid, timeout: float = SLOW_TIMEOUT_S) -> list[dict]:
    """Every rank's coordinates and group members, in rank order (19)."""
    return spawn(groups_rank, grid.world_size, grid, timeout=timeout)


def schedules_rank(
    rank: int,
    world_size: int,
    cases: Sequence[tuple[str, int, bool]],
    config: GPTConfig,
    sizes: tuple[int, ...],
) -> list[dict]:
    """Rank function: each (schedule, micro-batches, scale_grads) case trained
    with PyTorch's pipelining, compared with one process (19)."""
    from multigpu.gpt4d.schedules import schedule_training

    batches = make_token_batches(config, sizes)
    reference, ref_losses = one_process_training(config, batches)
    out = []
    for schedule, microbatches, scale_grads in cases:
        full, losses, plan = schedule_training(
            rank, world_size, config, batches, schedule, microbatches, scale_grads
        )
        out.append(
            {
                "schedule": schedule,
                "microbatches": microbatches,
                "scale_grads": scale_grads,
                "max_diff": _largest(full, {k: reference[k] for k in full}),
                "losses": losses,
                "reference_losses": ref_losses,
                "plan": plan,
            }
        )
    return out


def run_schedules(
    cases: Sequence[tuple[str, int, bool]],
    pp: int = 2,
    config: GPTConfig | None = None,
    sizes: tuple[int, ...] = (4, 4, 4),
    timeout: float = SLOW_TIMEOUT_S,
) -> list[list[dict]]:
    """Start :func:`schedules_rank` on ``pp`` ranks; per rank, its cases (19)."""
    config = GPTConfig(layers=4) if config is None else config
    return spawn(schedules_rank, pp, list(cases), config, sizes, timeout=timeout)
