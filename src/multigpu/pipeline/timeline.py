"""A pipeline's timeline: which stage computed what, when; and its bubble (16).

A :class:`ScheduleBlock` is one forward or backward of one micro-batch on one stage, in
seconds (recorded by :func:`multigpu.pipeline.run_actions`) or in time slots
(:func:`multigpu.pipeline.simulate_schedule`). The *bubble* is the time a stage
sits idle between the first block of the step and the last: with equal blocks
and p stages, GPipe and 1F1B both leave (p - 1)/(m + p - 1) of the step idle
(:func:`multigpu.costmodel.pipeline.pipeline_bubble_fraction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ScheduleBlock", "bubble_fraction", "busy_time", "step_span"]


@dataclass(frozen=True)
class ScheduleBlock:
    """One computation: ``op`` ("forward" or "backward") of ``microbatch`` on
    ``stage`` from ``start`` to ``end``."""

    stage: int
    op: str
    microbatch: int
    start: float
    end: float


def step_span(blocks: Sequence[ScheduleBlock]) -> tuple[float, float]:
    """(start of the first block, end of the last) over every stage."""
    return min(b.start for b in blocks), max(b.end for b in blocks)


def busy_time(blocks: Sequence[ScheduleBlock], stage: int) -> float:
    """How long ``stage`` computed."""
    return sum(b.end - b.start for b in blocks if b.stage == stage)


def bubble_fraction(blocks: Sequence[ScheduleBlock], num_stages: int) -> float:
    """The share of the step the stages sit idle, averaged over the stages:
    1 - busy / (p x span)."""
    start, end = step_span(blocks)
    busy = sum(busy_time(blocks, stage) for stage in range(num_stages))
    return 1.0 - busy / (num_stages * (end - start))
