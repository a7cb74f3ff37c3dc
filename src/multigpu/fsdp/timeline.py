"""What the all-gathers hid behind compute, read off a recorded timeline (14).

A timeline is a list of :class:`~multigpu.miniddp.TimelineEvent`: "compute" spans
(a unit's forward or backward, from the moment its parameters were there),
"all-gather" and "reduce-scatter" spans of the communication thread, and
"gathered" spans (a unit's memory there, from allocation to free).
:func:`gather_hidden_share` is the fraction of the all-gathers' time during which
some unit was computing: 0 when every unit waits for its own all-gather (no
prefetch), up to 1 when each arrives while earlier units compute.
"""

from __future__ import annotations

from multigpu.miniddp.timeline import TimelineEvent


def _overlap(event: TimelineEvent, spans: list[TimelineEvent]) -> float:
    """Seconds of ``event`` covered by ``spans`` (which do not overlap each other:
    one main thread computes)."""
    return sum(
        max(0.0, min(event.end, span.end) - max(event.start, span.start))
        for span in spans
    )


def gather_hidden_share(events: list[TimelineEvent]) -> float:
    """Of the time all-gathers ran, the share that compute ran too (14)."""
    compute = [e for e in events if e.lane == "compute"]
    gathers = [e for e in events if e.lane == "all-gather"]
    total = sum(e.end - e.start for e in gathers)
    hidden = sum(_overlap(e, compute) for e in gathers)
    return hidden / total if total > 0 else 0.0


def step_seconds(events: list[TimelineEvent]) -> float:
    """From the first event's start to the last one's end (14)."""
    if not events:
        return 0.0
    return max(e.end for e in events) - min(e.start for e in events)


def unit_life(events: list[TimelineEvent], unit: str) -> list[str]:
    """What happened to ``unit`` in a recorded step, in order: "gathered" (its
    memory back), "all-gather", "forward", "freed", "backward",
    "reduce-scatter" (14)."""
    moments = []
    for e in events:
        what, _, name = e.name.rpartition(" ") if e.lane == "compute" else ("", "", "")
        if e.lane == "gathered" and e.name == unit:
            moments += [(e.start, "gathered"), (e.end, "freed")]
        elif e.lane == "compute" and name == unit:
            moments.append((e.start, what))
        elif e.lane in ("all-gather", "reduce-scatter") and e.name == unit:
            moments.append((e.start, e.lane))
    return [what for _, what in sorted(moments, key=lambda m: m[0])]
