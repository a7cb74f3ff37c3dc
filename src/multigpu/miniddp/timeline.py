"""The timeline of one step of a wrapper made with ``record=True``: when each layer's
gradients were computed and when each all-reduce ran (10)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TimelineEvent:
    """One span on the timeline of a step: ``lane`` is "backward" or "all-reduce",
    times in seconds since the forward pass began (10)."""

    lane: str
    name: str
    start: float
    end: float


def hidden_fraction(events: list[TimelineEvent]) -> float:
    """Of the time all-reduces ran, the fraction that backward was still computing
    (before its last gradient): how much communication it hid (10)."""
    backward_end = max(
        (e.end for e in events if e.lane == "backward" and e.name != "sync"),
        default=0.0,
    )
    comm = [e for e in events if e.lane == "all-reduce"]
    total = sum(e.end - e.start for e in comm)
    hidden = sum(max(0.0, min(e.end, backward_end) - e.start) for e in comm)
    return hidden / total if total > 0 else 0.0
