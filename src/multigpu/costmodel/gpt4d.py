"""The formulas of notebook 19: the bubble of each pipeline schedule (19).

With p ranks, m micro-batches and v stages per rank (chunks), GPipe and 1F1B
leave (p - 1)/(m + p - 1) of a step idle, interleaved 1F1B (p - 1)/(v m + p - 1)
(:func:`multigpu.costmodel.pipeline.pipeline_bubble_fraction`, 16). The
zero-bubble schedules (Qi et al., 2024, arXiv:2401.10241) split a backward into
I (the input's gradient) and W (the weights'); with F = I = W = 1 slot, a rank
works 3 v m slots and, as ZB-H1 does, waits (p - 1)(F + I - W) = p - 1 of them:
:func:`zero_bubble_fraction`.
"""

from __future__ import annotations

from multigpu.costmodel.pipeline import pipeline_bubble_fraction

__all__ = ["schedule_bubble", "zero_bubble_fraction"]

ZERO_BUBBLE = ("interleaved-zero-bubble", "zbv", "dualpipev")


def zero_bubble_fraction(
    num_stages: int, num_microbatches: int, chunks: int = 1
) -> float:
    """(p - 1)/(3 v m + p - 1): the idle share of a zero-bubble schedule with
    F = I = W = 1 slot (19)."""
    work = 3 * chunks * num_microbatches
    return (num_stages - 1) / (work + num_stages - 1)


def schedule_bubble(schedule: str, num_stages: int, num_microbatches: int) -> float:
    """The formula's bubble for a schedule of :mod:`multigpu.gpt4d.schedules` on
    ``num_stages`` ranks (19)."""
    if schedule in ("gpipe", "1f1b"):
        return pipeline_bubble_fraction(num_stages, num_microbatches)
    if schedule == "interleaved-1f1b":
        return pipeline_bubble_fraction(num_stages, num_microbatches, chunks=2)
    if schedule in ZERO_BUBBLE:
        return zero_bubble_fraction(num_stages, num_microbatches, chunks=2)
    raise ValueError(
        f"No formula for schedule {schedule!r}; choose one of gpipe, 1f1b, "
        f"interleaved-1f1b, {', '.join(ZERO_BUBBLE)}."
    )
