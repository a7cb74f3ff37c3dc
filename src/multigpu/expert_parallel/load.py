"""The load of experts and ranks: how many tokens each computes, and how uneven
that is (18).

An expert-parallel step is as slow as its busiest rank: every rank waits for the
combine, which waits for the rank whose experts got the most tokens. So the
number that matters is the largest load over the mean, 1 when perfectly even
(:func:`imbalance`). :func:`tokens_per_rank` adds the experts' loads up by the rank
that holds them (E/ep consecutive experts per rank).
"""

from __future__ import annotations

from collections.abc import Sequence

from multigpu.expert_parallel.dispatch import experts_per_rank

__all__ = ["imbalance", "load_table", "tokens_per_rank"]


def tokens_per_rank(per_expert: Sequence[int], ep_size: int) -> list[int]:
    """The tokens each rank computes: the loads of its E/ep experts added up (18)."""
    local = experts_per_rank(len(per_expert), ep_size)
    return [sum(per_expert[r * local : (r + 1) * local]) for r in range(ep_size)]


def imbalance(loads: Sequence[int]) -> float:
    """The largest load over the mean load: 1.0 when even, E when one expert (or
    rank) of E does everything (18)."""
    total = sum(loads)
    return max(loads) * len(loads) / total if total else 1.0


def load_table(
    histories: dict[str, Sequence[Sequence[int]]], steps: Sequence[int], ep_size: int
) -> list[str]:
    """Lines of a table: for each run (name -> tokens per expert at every step) and
    each step asked, the tokens per expert, per rank and the imbalance (18)."""
    lines = [f"{'run':<14}{'step':>5}  {'per expert':<22}{'per rank':<12}max/mean"]
    for name, per_step in histories.items():
        for step in steps:
            loads = list(per_step[step])
            ranks = tokens_per_rank(loads, ep_size)
            lines.append(
                f"{name:<14}{step:>5}  {str(loads):<22}{str(ranks):<12}"
                f"{imbalance(loads):.2f}"
            )
    return lines
