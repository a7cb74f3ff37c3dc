"""Run a schedule on paper: time slots, blocking messages, deadlocks (16).

Each stage works through its actions in order. A forward takes ``forward_time``
slots and a backward ``backward_time``; a message takes no time, but, as gloo's
``send`` does, it completes only when the neighbour has posted the matching
receive (messages on one link are matched in order). A list of messages is posted
at once and completes when all of them have. When no stage can move, the schedule
has deadlocked: :class:`Simulation` names what each stuck stage waits in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multigpu.pipeline.schedules import Action, as_messages
from multigpu.pipeline.timeline import ScheduleBlock

__all__ = ["Simulation", "simulate_schedule"]

_PEER = {
    "send_activation": (1, "recv_activation"),
    "recv_activation": (-1, "send_activation"),
    "send_gradient": (-1, "recv_gradient"),
    "recv_gradient": (1, "send_gradient"),
}


@dataclass
class Simulation:
    """``blocks`` in slots; ``stuck`` {stage: the action it waits in} when the
    schedule deadlocked (else empty); ``mismatches``: messages whose micro-batch
    differs from the one the receiver expected, as words."""

    blocks: list[ScheduleBlock] = field(default_factory=list)
    stuck: dict[int, Action] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    @property
    def deadlocked(self) -> bool:
        return bool(self.stuck)


def _channel(stage: int, op: str) -> tuple[int, int, str]:
    """(sender, receiver, kind) of the link a message travels on."""
    step, _ = _PEER[op]
    kind = op.split("_")[1]
    sender = stage if op.startswith("send") else stage + step
    receiver = stage + step if op.startswith("send") else stage
    return sender, receiver, kind


def simulate_schedule(
    actions: list[list[Action]], forward_time: float = 1.0, backward_time: float = 2.0
) -> Simulation:
    """Play ``actions`` (one list per stage) with blocking messages (16)."""
    num_stages = len(actions)
    position = [0] * num_stages  # next action of each stage
    clock = [0.0] * num_stages
    # per link: the messages posted so far, as [(microbatch, time posted)] per side
    posted: dict[tuple[int, int, str, str], list[tuple[int, float]]] = {}
    mine: dict[int, list[tuple[tuple, int]]] = {}  # stage -> its posted (key, index)
    result = Simulation()
    moved = True
    while moved:
        moved = False
        for stage in range(num_stages):
            if position[stage] >= len(actions[stage]):
                continue
            action = actions[stage][position[stage]]
            pairs = as_messages(action)
            op, index = pairs[0]
            if op in ("forward", "backward"):
                duration = forward_time if op == "forward" else backward_time
                start = clock[stage]
                clock[stage] = start + duration
                result.blocks.append(
                    ScheduleBlock(stage, op, index, start, clock[stage])
                )
                position[stage] += 1
                moved = True
                continue
            if stage not in mine:  # post every message of the action once
                mine[stage] = []
                for op, index in pairs:
                    side = "send" if op.startswith("send") else "recv"
                    key = (*_channel(stage, op), side)
                    posted.setdefault(key, []).append((index, clock[stage]))
                    mine[stage].append((key, len(posted[key]) - 1))
                moved = True  # posting is progress: a neighbour may now complete
            times = []
            for key, slot in mine[stage]:
                other = (*key[:3], "recv" if key[3] == "send" else "send")
                if len(posted.get(other, [])) <= slot:
                    break
                times += [posted[key][slot][1], posted[other][slot][1]]
            else:
                for key, slot in mine[stage]:
                    if key[3] == "recv":
                        got = posted[(*key[:3], "send")][slot][0]
                        wanted = posted[key][slot][0]
                        if got != wanted:
                            result.mismatches.append(
                                f"stage {stage} receives {key[2]}({wanted}) but "
                                f"stage {key[0]} sent {key[2]}({got}) at that point"
                            )
                clock[stage] = max(times)
                del mine[stage]
                position[stage] += 1
                moved = True
    for stage in range(num_stages):
        if position[stage] < len(actions[stage]):
            result.stuck[stage] = actions[stage][position[stage]]
    return result
