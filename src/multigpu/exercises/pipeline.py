"""The checker of notebook 16's exercise: the learner's 1F1B order of computations,
sends and receives for one stage (:func:`check_one_f_one_b`), run on ranks (16).

The learner's function only returns lists, so it runs here in the parent; the
lists are checked on paper first (:func:`multigpu.pipeline.schedule_problem`,
:func:`multigpu.pipeline.simulate_schedule`), then run on real ranks. A
deadlock-prone order is run too, under a short timeout per message: the ranks
give up, spawn ends them all, and the message says which sends waited.
"""

from __future__ import annotations

import traceback

import torch
from torch import nn

from multigpu.core.checks import check_positive_int
from multigpu.costmodel.pipeline import pipeline_bubble_fraction
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.pipeline import (
    COMPUTE_OPS,
    ScheduleFunction,
    as_messages,
    bubble_fraction,
    in_flight_peak,
    make_pipeline_data,
    make_pipeline_mlp,
    one_process_gradients,
    schedule_problem,
    simulate_schedule,
)
from multigpu.ranks.pipeline import run_pipelines
from multigpu.runtime.launch import WorkerError

_HINTS = {
    "never does send": "a neighbour would wait for it forever. Every stage but the "
    "last sends each micro-batch's activation once; every stage but the first sends "
    "each gradient once.",
    "never does recv": "the neighbour's send would wait for it forever. Receive each "
    "message your neighbour sends, once.",
    "twice": "an extra message: its neighbour never receives it, so the send waits "
    "forever. Exchange each message once per micro-batch.",
    "yet it does": "an extra message to a rank that does not exist. The first stage "
    "receives no activation and sends no gradient; the last sends no activation and "
    "receives no gradient (its backward starts from the loss).",
}


def _stage_lists(
    schedule: ScheduleFunction, num_stages: int, num_microbatches: int
) -> tuple[list | None, str | None]:
    actions = []
    for stage in range(num_stages):
        try:
            actions.append(schedule(stage, num_stages, num_microbatches))
        except Exception as exc:  # the learner's error, shown in one line
            line = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return (
                None,
                f"FAIL: your function raised an error for stage {stage}: {line}",
            )
    return actions, None


def _diagnose_lists(
    actions: list, num_stages: int, num_microbatches: int
) -> str | None:
    for stage, stage_actions in enumerate(actions):
        problem = schedule_problem(stage, num_stages, num_microbatches, stage_actions)
        if problem is not None:
            message = "_" in problem.split("(")[0]  # a send or a receive
            hint = next((h for key, h in _HINTS.items() if key in problem), "")
            return (
                f"FAIL: {problem}: {hint}" if message and hint else f"FAIL: {problem}."
            )
    return None


def _deadlock_message(stuck: dict, timeout: float) -> str:
    waits = "; ".join(
        f"stage {s} waits in " + " + ".join(f"{op}({i})" for op, i in as_messages(a))
        for s, a in sorted(stuck.items())
    )
    return (
        f"FAIL: deadlock: the ranks waited {timeout:g} s and gave up ({waits}). "
        "gloo's send waits until the neighbour posts the matching receive, so two "
        "neighbours that both send first wait for each other: a send and a receive "
        "that happen at the same moment were posted one after the other instead of "
        "together, as one action (section 4)."
    )


def _computations(actions: list) -> list[str]:
    """The stage's forwards and backwards, in its order."""
    return [op for a in actions for op, _ in as_messages(a) if op in COMPUTE_OPS]


def _too_many_in_flight(stage: int, peak: int, bound: int, actions: list) -> str:
    held = (
        f"FAIL: stage {stage} holds the activations of {peak} micro-batches at "
        f"once; 1F1B holds at most p - s = {bound}."
    )
    computations = _computations(actions)
    warmup = computations.index("backward")  # forwards before the first backward
    if "forward" not in computations[warmup:]:
        return (
            f"{held} That is GPipe's order (every forward before any backward), "
            "which keeps every micro-batch's activations until the backwards begin."
        )
    if warmup > bound:
        return (
            f"{held} It runs {warmup} forwards before its first backward: too many "
            "warm-up forwards for this stage. Each stage's warm-up count depends on "
            "its distance from the last stage: a stage nearer the end gets its first "
            "gradient back sooner, so it starts backwards after fewer forwards."
        )
    return (
        f"{held} Its warm-up is right, but after it the stage runs more forwards "
        "than backwards: in 1F1B's steady state each forward is followed by one "
        "backward, so the micro-batches held stay the same."
    )


def _too_few_warmup(actions: list, num_stages: int, num_microbatches: int) -> str:
    for stage, stage_actions in enumerate(actions):
        warmup = _computations(stage_actions).index("backward")
        if warmup < min(num_stages - stage, num_microbatches):
            return (
                f" Stage {stage} runs {warmup} forward(s) before its first backward: "
                "too few warm-up forwards for this stage, so it waits for a gradient "
                "while it could be sending the next micro-batches down the pipeline."
            )
    return " Some stage waits for a neighbour while it could be computing."


def check_one_f_one_b(
    schedule: ScheduleFunction,
    num_stages: int = 4,
    num_microbatches: int = 6,
    model: nn.Sequential | None = None,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
    message_timeout: float = 3.0,
    tolerance: float = 1e-12,
) -> ExerciseResult:
    """Is ``schedule(stage, num_stages, num_microbatches)`` 1F1B: every message
    once, in an order that cannot deadlock, at most p - s micro-batches in flight
    on stage s, no more idle time than (p-1)/(m+p-1), and gradients equal to one
    process? (passed, what to fix) (16)."""
    p = check_positive_int("num_stages", num_stages)
    m = check_positive_int("num_microbatches", num_microbatches)
    actions, error = _stage_lists(schedule, p, m)
    if error is None:
        error = _diagnose_lists(actions, p, m)
    if error is not None:
        return fail(error)
    simulation = simulate_schedule(actions)
    if simulation.mismatches:
        return fail(
            f"FAIL: wrong micro-batch order: {simulation.mismatches[0]}. Messages "
            "between two ranks arrive in the order they were sent, so every stage "
            "must go through the micro-batches in the same order, 0, 1, 2, ..., "
            "forwards and backwards alike."
        )
    model = make_pipeline_mlp() if model is None else model
    X, y = make_pipeline_data() if data is None else data
    if simulation.deadlocked:
        try:
            run_pipelines(model, X, y, p, [(m, actions, (0.0, 0.0), message_timeout)])
        except WorkerError as exc:
            if "MessageTimeoutError" not in str(exc):
                return fail(f"FAIL: the ranks failed: {str(exc).splitlines()[0]}")
            return fail(_deadlock_message(simulation.stuck, message_timeout))
    peaks = [in_flight_peak(a) for a in actions]
    for stage, peak in enumerate(peaks):
        if peak > min(p - stage, m):
            bound = min(p - stage, m)
            return fail(_too_many_in_flight(stage, peak, bound, actions[stage]))
    idle = bubble_fraction(simulation.blocks, p)
    formula = pipeline_bubble_fraction(p, m)
    if idle > formula + 1e-9:
        return fail(
            f"FAIL: no deadlock and few activations, but the stages sit idle "
            f"{idle:.0%} of the step, not 1F1B's (p-1)/(m+p-1) = {formula:.0%}: the "
            "stages do not overlap." + _too_few_warmup(actions, p, m)
        )
    try:
        run = run_pipelines(
            model, X, y, p, [(m, actions, (0.0, 0.0), message_timeout)]
        )[0]
    except WorkerError as exc:
        if "MessageTimeoutError" in str(exc):
            return fail(_deadlock_message({}, message_timeout))
        return fail(f"FAIL: the ranks failed: {str(exc).splitlines()[0]}")
    _, reference = one_process_gradients(model, X, y)
    worst = max(
        (run.gradients[n] - g).abs().max().item()
        for n, g in reference.items()
        if g is not None
    )
    if worst > tolerance:
        return fail(f"FAIL: the gradients are {worst:.1e} away from one process.")
    return ok(
        f"PASS: 1F1B on {p} stages with {m} micro-batches: no deadlock, "
        f"{', '.join(map(str, run.peak_in_flight))} micro-batches in flight at most on "
        f"stages 0-{p - 1} (p - s), idle "
        f"{idle:.4f} of the step as (p-1)/(m+p-1), gradients equal to one "
        f"process within {tolerance:.0e}."
    )
