"""The load of experts and ranks: how many tokens each computes, and how uneven
that is (18).

Two loads matter. An expert's: with a capacity, the tokens beyond it are dropped.
A rank's, its experts' loads added up (:func:`tokens_per_rank`, E/ep consecutive
experts per rank): an expert-parallel step is as slow as its busiest rank, since
every rank waits in the combine for the rank whose experts got the most tokens.
For both, the measure is the largest load over the mean, 1 when perfectly even
(:func:`imbalance`); with one expert per rank the two are the same.
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
    each step asked, the tokens per expert and their max/mean, the tokens per rank
    and theirs (18)."""
    lines = [
        f"{'run':<14}{'step':>5}  {'per expert':<20}{'max/mean':<10}"
        f"{'per rank':<12}max/mean"
    ]
    for name, per_step in histories.items():
        for step in steps:
            loads = list(per_step[step])
            ranks = tokens_per_rank(loads, ep_size)
            lines.append(
                f"{name:<14}{step:>5}  {str(loads):<20}{imbalance(loads):<10.2f}"
                f"{str(ranks):<12}{imbalance(ranks):.2f}"
            )
    return lines
