"""The rank grid of a 4-D job: rank -> (dp, pp, cp, tp), one group per dimension (19).

The ranks are numbered with tp fastest, then cp, then pp, then dp (tp fastest as
in torchtitan's and Megatron-LM's meshes: the tensor-parallel ranks, which talk the
most, are neighbours, so on a real cluster they share a node; both put pp
outermost, (pp, dp, cp, tp), where dp is outermost here, which changes only the
rank numbers). A rank's group
along a dimension is the ranks whose other three coordinates equal its own.
:func:`grid_problem` says, in one line, why a grid cannot train a model, or None.
:func:`build_groups` makes every group of a grid (every rank must call it, in the
same order) and returns this rank's; ``"tied"`` is the first and the last
pipeline stage of this rank's pipeline, which share the tied embedding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from multigpu.gpt4d.config import GPTConfig

__all__ = ["DIMS", "Grid", "RankGroups", "build_groups", "grid_problem"]

DIMS = ("dp", "pp", "cp", "tp")  # slowest to fastest


@dataclass(frozen=True)
class Grid:
    """How many ranks along each dimension (19)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes in DIMS order (dp, pp, cp, tp)."""
        return tuple(getattr(self, d) for d in DIMS)

    @property
    def world_size(self) -> int:
        """The number of ranks: the product of the four sizes."""
        return self.dp * self.tp * self.pp * self.cp

    def coords(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s coordinate along each dimension."""
        out = {}
        for dim in reversed(DIMS):
            size = getattr(self, dim)
            rank, out[dim] = divmod(rank, size)
        return {d: out[d] for d in DIMS}

    def rank_of(self, **coords: int) -> int:
        """The rank at these coordinates (missing ones are 0)."""
        rank = 0
        for dim in DIMS:
            rank = rank * getattr(self, dim) + coords.get(dim, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim``: ranks that differ only in ``dim``."""
        others = [d for d in DIMS if d != dim]
        ranges = [range(getattr(self, d)) for d in others]
        return [
            [self.rank_of(**dict(zip(others, fixed)), **{dim: i}) for i in range(n)]
            for fixed in itertools.product(*ranges)
            for n in [getattr(self, dim)]
        ]

    def tied_groups(self) -> list[list[int]]:
        """Per pipeline, its first and last stage (one rank if pp is 1)."""
        return [sorted({g[0], g[-1]}) for g in self.groups("pp")]

    def label(self) -> str:
        """e.g. "dp2 x tp2 x pp2" (the sizes above 1; "one process" if none)."""
        parts = [f"{d}{getattr(self, d)}" for d in ("dp", "tp", "pp", "cp")]
        big = [
            p for p, d in zip(parts, ("dp", "tp", "pp", "cp")) if getattr(self, d) > 1
        ]
        return " x ".join(big) or "one process"


def grid_problem(
    grid: Grid,
    world_size: int,
    config: GPTConfig,
    batch: int = 0,
    microbatches: int = 1,
) -> str | None:
    """Why ``grid`` cannot train ``config`` on ``world_size`` ranks, in one line
    (what is wrong, how to fix it), or None (19). ``batch``: the smallest global
    batch in sequences (0: not checked)."""
    for dim in ("dp", "tp", "pp", "cp"):
        size = getattr(grid, dim)
        if not isinstance(size, int) or size < 1:
            return f"--{dim} is {size!r}; give a whole number of ranks, 1 or more."
    if grid.world_size != world_size:
        return (
            f"dp*tp*pp*cp = {grid.dp}*{grid.tp}*{grid.pp}*{grid.cp} = "
            f"{grid.world_size}, but the world has {world_size} ranks; make the "
            "product equal the number of processes (--nproc-per-node)."
        )
    if config.heads % grid.tp:
        return (
            f"heads {config.heads} is not divisible by tp {grid.tp}; each "
            "tensor-parallel rank computes whole heads, so choose tp dividing heads."
        )
    if config.layers % grid.pp:
        return (
            f"layers {config.layers} is not divisible by pp {grid.pp}; each stage "
            "holds layers/pp blocks, so choose pp dividing layers."
        )
    if config.seq_len % grid.cp:
        return (
            f"seq_len {config.seq_len} is not divisible by cp {grid.cp}; each "
            "context-parallel rank holds seq_len/cp tokens, so choose cp dividing it."
        )
    if batch and batch < grid.dp * microbatches:
        return (
            f"a batch of {batch} sequences cannot give each of dp {grid.dp} ranks "
            f"{microbatches} micro-batches of at least one sequence; use a batch of "
            f"at least {grid.dp * microbatches} or fewer micro-batches."
        )
    return None


@dataclass
class RankGroups:
    """This rank's coordinates, and its process group and members per dimension
    (``group`` None where the dimension has size 1: nothing to talk about) (19)."""

    grid: Grid
    rank: int
    coords: dict[str, int]
    members: dict[str, list[int]]
    group: dict[str, object]

    def size(self, dim: str) -> int:
        """How many ranks this rank's group along ``dim`` has."""
        return len(self.members[dim])


def build_groups(grid: Grid, rank: int) -> RankGroups:
    """Make every group of ``grid`` (every rank calls this, in the same order) and
    return this rank's (19)."""
    import torch.distributed as dist

    members: dict[str, list[int]] = {}
    group: dict[str, object] = {}
    for dim in (*DIMS, "tied"):
        all_groups = grid.tied_groups() if dim == "tied" else grid.groups(dim)
        for ranks in all_groups:
            made = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                members[dim], group[dim] = ranks, made
    return RankGroups(grid, rank, grid.coords(rank), members, group)
