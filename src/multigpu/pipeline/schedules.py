"""Pipeline schedules as lists of actions, one list per stage (16).

An action is a pair ``(op, microbatch)``: ``("forward", i)``, ``("backward", i)``,
or a message to a neighbour: ``("recv_activation", i)`` from the previous stage,
``("send_activation", i)`` to the next, ``("recv_gradient", i)`` from the next,
``("send_gradient", i)`` to the previous. A *list* of messages is one action
whose messages are posted together (``dist.batch_isend_irecv``), as Megatron-LM's
``send_forward_recv_backward`` does (megatron/core/pipeline_parallel/
p2p_communication.py, https://github.com/NVIDIA/Megatron-LM).

- :func:`gpipe_actions`: every forward, then every backward (Huang et al., 2019);
  stage s holds all m micro-batches' activations at once.
- :func:`one_f_one_b_actions`: 1F1B (PipeDream-Flush, Narayanan et al., 2021,
  arXiv:2006.09503, the schedule of Megatron-LM):
  p - s - 1 warm-up forwards, then one forward and one backward in turn, then the
  remaining backwards; stage s holds at most p - s micro-batches.
- :func:`schedule_problem`: what is wrong with a stage's list (a message missing
  or doubled, an order that uses a tensor before it exists), or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = [
    "COMPUTE_OPS",
    "MESSAGE_OPS",
    "SCHEDULES",
    "Action",
    "ScheduleFunction",
    "as_messages",
    "gpipe_actions",
    "in_flight_peak",
    "one_f_one_b_actions",
    "schedule_actions",
    "schedule_problem",
]

Action = tuple[str, int] | list[tuple[str, int]]
ScheduleFunction = Callable[[int, int, int], list[Action]]
"""``schedule(stage, num_stages, num_microbatches) -> actions of that stage``."""

COMPUTE_OPS = ("forward", "backward")
MESSAGE_OPS = ("recv_activation", "send_activation", "recv_gradient", "send_gradient")


def _messages(stage: int, num_stages: int) -> tuple[str, ...]:
    """The messages a stage exchanges per micro-batch: none with a missing side."""
    ops = []
    if stage > 0:
        ops += ["recv_activation", "send_gradient"]
    if stage < num_stages - 1:
        ops += ["send_activation", "recv_gradient"]
    return tuple(ops)


def gpipe_actions(stage: int, num_stages: int, num_microbatches: int) -> list[Action]:
    """GPipe: all forwards in micro-batch order, then all backwards (16)."""
    first, last = stage == 0, stage == num_stages - 1
    actions: list[Action] = []
    for i in range(num_microbatches):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i)]
        actions += [] if last else [("send_activation", i)]
    for i in range(num_microbatches):
        actions += [] if last else [("recv_gradient", i)]
        actions += [("backward", i)]
        actions += [] if first else [("send_gradient", i)]
    return actions


def _together(messages: list[tuple[str, int]]) -> list[Action]:
    """Messages posted at once: one action (a list), a single message, or none."""
    if len(messages) > 1:
        return [messages]
    return list(messages)


def one_f_one_b_actions(
    stage: int, num_stages: int, num_microbatches: int, paired: bool = True
) -> list[Action]:
    """1F1B as Megatron-LM orders it (16). With ``paired=False`` the steady state's
    send and receive are posted one after the other instead of together: on gloo,
    whose send waits for the matching receive, neighbours then both wait in a send."""
    first, last = stage == 0, stage == num_stages - 1
    group = _together if paired else list
    warmup = min(num_stages - stage - 1, num_microbatches)
    remaining = num_microbatches - warmup
    actions: list[Action] = []
    for i in range(warmup):
        actions += [] if first else [("recv_activation", i)]
        actions += [("forward", i), ("send_activation", i)]
    if remaining and not first:
        actions += [("recv_activation", warmup)]
    for k in range(remaining):
        forward = warmup + k
        actions += [("forward", forward)]
        if not last:
            actions += group([("send_activation", forward), ("recv_gradient", k)])
        actions += [("backward", k)]
        if not first:
            more = k < remaining - 1
            pair = [("send_gradient", k)] + [("recv_activation", forward + 1)] * more
            actions += group(pair)
    for k in range(remaining, num_microbatches):
        actions += [("recv_gradient", k), ("backward", k)]
        actions += [] if first else [("send_gradient", k)]
    return actions


SCHEDULES = ("gpipe", "1f1b", "1f1b unpaired")


def schedule_actions(
    schedule: str | list[list[Action]], num_stages: int, num_microbatches: int
) -> list[list[Action]]:
    """Every stage's actions: ``schedule`` is one of SCHEDULES, or the lists."""
    if isinstance(schedule, list):
        return schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"Unknown schedule {schedule!r}. Choose one of: {SCHEDULES}.")
    if schedule == "gpipe":
        build = gpipe_actions
    else:
        paired = schedule == "1f1b"

        def build(s, p, m):
            return one_f_one_b_actions(s, p, m, paired)

    return [build(s, num_stages, num_microbatches) for s in range(num_stages)]


def as_messages(action: Action) -> list[tuple[str, int]]:
    """The messages or the computation of one action, as a list of pairs."""
    return list(action) if isinstance(action, list) else [action]


def in_flight_peak(actions: Sequence[Action]) -> int:
    """The most micro-batches whose forward has run and backward has not, at once:
    the activations the stage must hold."""
    live = peak = 0
    for action in actions:
        for op, _ in as_messages(action):
            live += {"forward": 1, "backward": -1}.get(op, 0)
            peak = max(peak, live)
    return peak


def _shape_problem(action: object) -> str | None:
    pairs = action if isinstance(action, list) else [action]
    if not pairs:
        return "an empty list of messages"
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            return f"{pair!r} is not a pair (op, microbatch)"
        op, index = pair
        if op not in COMPUTE_OPS + MESSAGE_OPS or not isinstance(index, int):
            return (
                f"{pair!r} is not an action (op is one of {COMPUTE_OPS + MESSAGE_OPS})"
            )
        if isinstance(action, list) and op in COMPUTE_OPS:
            return f"{pair!r} is a computation inside a list of messages"
    return None


def schedule_problem(
    stage: int, num_stages: int, num_microbatches: int, actions: object
) -> str | None:
    """The first thing that makes ``actions`` impossible for this stage, in words,
    or None: every computation once per micro-batch, every message this stage
    exchanges once per micro-batch (none to a neighbour it lacks), each tensor
    received before it is used and computed before it is sent."""
    if not isinstance(actions, list):
        return f"the schedule returned {type(actions).__name__}, not a list of actions"
    expected = COMPUTE_OPS + _messages(stage, num_stages)
    done: dict[tuple[str, int], int] = {}
    for action in actions:
        problem = _shape_problem(action)
        if problem is not None:
            return problem
        for op, i in as_messages(action):
            if op not in expected:
                side = (
                    "previous" if op in ("recv_activation", "send_gradient") else "next"
                )
                return f"stage {stage} has no {side} stage, yet it does {op}({i})"
            if not 0 <= i < num_microbatches:
                return (
                    f"{op}({i}): there are only micro-batches 0-{num_microbatches - 1}"
                )
            if (op, i) in done:
                return f"stage {stage} does {op}({i}) twice"
            done[(op, i)] = len(done)
    for op in expected:
        for i in range(num_microbatches):
            if (op, i) not in done:
                return f"stage {stage} never does {op}({i})"
    before = [
        ("recv_activation", "forward", "runs forward({i}) before receiving its input"),
        ("forward", "send_activation", "sends activation({i}) before computing it"),
        ("forward", "backward", "runs backward({i}) before forward({i})"),
        (
            "recv_gradient",
            "backward",
            "runs backward({i}) before receiving its gradient",
        ),
        ("backward", "send_gradient", "sends gradient({i}) before computing it"),
    ]
    for earlier, later, words in before:
        for i in range(num_microbatches):
            pair = done.get((earlier, i)), done.get((later, i))
            if None not in pair and pair[0] > pair[1]:
                return f"stage {stage} " + words.format(i=i)
    return None
