"""The checker of notebook 18's exercise: the learner's dispatch and combine with
split sizes (:func:`check_dispatch_combine`), run on 3 ranks (18).

Each rank holds 2 of 6 experts; expert e multiplies its rows by a matrix of its own,
so every row's output and gradient are known in advance. The routing is uneven on
purpose: rank 1's rows all go to other ranks, expert 3 gets no row, and no rank
receives what it sends. Before every ``all_to_all_single`` the ranks compare their
split sizes (:func:`multigpu.ranks.expert_parallel.dispatch_exercise_rank`), so a
rank that expects the wrong number of rows is named instead of gloo aborting them
all. When the outputs are wrong, what the experts received says why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from multigpu.exercises._learner_code import (
    importable_or_raise,
    last_line,
    ranks_were_stuck,
)
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.expert_parallel import dispatch_exercise_rank
from multigpu.runtime.launch import QUICK_TIMEOUT_S, WorkerError, spawn

__all__ = ["EXERCISE_ROUTING", "check_dispatch_combine", "exercise_problem"]

WORLD_SIZE = 3
NUM_EXPERTS = 6  # 2 per rank
DIM = 3
# The expert of each row, per rank: rank 1's rows all leave it, expert 3 gets none.
EXERCISE_ROUTING = ([5, 0, 1, 4, 0, 5, 1], [0, 5, 4, 0], [2, 5, 0, 2, 4])
CLOSE = 1e-12  # float64; a right answer is exact up to rounding

# What a split-size error in the backward pass adds: dispatch's and combine's say
# what is wrong themselves (the sizes a rank expects, or whose they are).
_BACKWARD_MISTAKE = "the gradients do not go back the way their rows came"


def exercise_problem(seed: int = 0) -> dict:
    """The checker's problem: per rank its rows (float64) and their experts, the
    experts' matrices and the weights of the loss (18)."""
    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    experts = [torch.tensor(route) for route in EXERCISE_ROUTING]
    return {
        "num_experts": NUM_EXPERTS,
        "experts": experts,
        "rows": [random(len(e), DIM) for e in experts],
        "matrices": random(NUM_EXPERTS, DIM, DIM),
        "weights": [random(len(e), DIM) for e in experts],
    }


def _canonical(rows: torch.Tensor) -> torch.Tensor:
    """Rows in a fixed order (by their first value), to compare sets of rows."""
    return rows[rows[:, 0].argsort()] if len(rows) else rows


def _same_rows(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_canonical(a), _canonical(b))


def _expected_received(problem: dict, rank: int) -> list[torch.Tensor]:
    """The rows each of ``rank``'s experts must get, from all ranks."""
    local = NUM_EXPERTS // WORLD_SIZE
    return [
        torch.cat(
            [
                rows[experts == e]
                for rows, experts in zip(problem["rows"], problem["experts"])
            ]
        )
        for e in range(rank * local, (rank + 1) * local)
    ]


def _wrong_received(problem: dict, results: list[dict]) -> str | None:
    for rank, result in enumerate(results):
        wanted = _expected_received(problem, rank)
        counts = [len(rows) for rows in wanted]
        received = result.get("received")
        if received is None:
            return f"FAIL: dispatch on rank {rank} did not return a tensor of rows."
        if not _same_rows(received, torch.cat(wanted)):
            got = (
                f"{len(received)} rows, but {sum(counts)} are routed to them"
                if len(received) != sum(counts)
                else f"{len(received)} rows, but not the ones routed to them"
            )
            return (
                f"FAIL: rank {rank}'s experts got {got}: the rows do not reach the "
                "rank that holds their expert. The rows for one rank must be "
                "consecutive in what a rank sends, in rank order, as many as its "
                "split size says."
            )
        if result["per_expert"] != counts:
            return (
                f"FAIL: rank {rank} says its experts get {result['per_expert']} rows, "
                f"but {counts} are routed to them: count the received rows per local "
                "expert, from every sending rank."
            )
        pieces = received.split(counts)
        if not all(_same_rows(p, w) for p, w in zip(pieces, wanted)):
            return (
                f"FAIL: rank {rank} received the right rows but hands them to its "
                "experts in the wrong pieces: the received rows come sender by "
                "sender, and within a sender expert by expert; each expert needs its "
                "rows from every sender together."
            )
    return None


def _wrong_output(problem: dict, results: list[dict]) -> str | None:
    matrices = problem["matrices"]
    for rank, result in enumerate(results):
        rows, experts = problem["rows"][rank], problem["experts"][rank]
        wanted = torch.stack([r @ matrices[e] for r, e in zip(rows, experts)])
        output = result["output"]
        if (output - wanted).abs().max().item() < CLOSE:
            continue
        by_expert = wanted[torch.argsort(experts, stable=True)]
        if (output - by_expert).abs().max().item() < CLOSE:
            return (
                f"FAIL: rank {rank}'s outputs come back in the order the rows were "
                "sent (sorted by expert), not in the order of the rows given to "
                "dispatch: combining in dispatch order puts each output on another "
                "row."
            )
        if _same_rows(output, wanted):
            return (
                f"FAIL: rank {rank} got back the right outputs in the wrong order: "
                "output i must belong to row i of what was given to dispatch."
            )
        return (
            f"FAIL: rank {rank}'s outputs are not its rows' experts' outputs: the "
            "outputs go back to the wrong ranks, or in the wrong pieces."
        )
    return None


def _wrong_gradient(problem: dict, results: list[dict]) -> str | None:
    matrices = problem["matrices"]
    for rank, result in enumerate(results):
        experts, weights = problem["experts"][rank], problem["weights"][rank]
        wanted = torch.stack([w @ matrices[e].T for w, e in zip(weights, experts)])
        grad = result.get("grad")
        if grad is None:
            return (
                f"FAIL: the outputs are right, but rank {rank}'s rows got no gradient: "
                "autograd cannot follow the rows through the all-to-all you used. "
                "The lesson's all-to-all sends the gradients back."
            )
        if (grad - wanted).abs().max().item() > CLOSE:
            return (
                f"FAIL: the outputs are right, but rank {rank}'s rows got the wrong "
                "gradients: a row's gradient must come back from the expert that "
                "computed its output."
            )
    return None


def check_dispatch_combine(
    dispatch: Callable, combine: Callable, timeout: float = QUICK_TIMEOUT_S
) -> ExerciseResult:
    """Run the learner's ``dispatch(rows, expert_of_row, num_experts, group)`` and
    ``combine(expert_outputs, plan, group)`` on 3 ranks with 2 experts each; check
    the rows each expert gets, the outputs in the rows' order, and their gradients
    (18's exercise)."""
    importable_or_raise(dispatch, "dispatch")
    importable_or_raise(combine, "combine")
    problem = exercise_problem()
    try:
        results = spawn(
            dispatch_exercise_rank, WORLD_SIZE, dispatch, combine, problem,
            timeout=timeout,
        )  # fmt: skip
    except WorkerError as error:
        if ranks_were_stuck(error):
            return fail(
                f"FAIL: the ranks waited {timeout:g} s for each other and gave up: "
                "not every rank made the same collective calls in the same order."
            )
        line = last_line(error)
        if "SplitSizeError: " in line:
            message = line.split("SplitSizeError: ", 1)[1]
            if message.startswith("in the backward pass,"):
                message = f"{message}: {_BACKWARD_MISTAKE}"
            return fail(f"FAIL: {message}.")
        return fail(f"FAIL: your code raised an error on a rank: {line}")
    problems = [r.get("problem") for r in results]
    found = _wrong_received(problem, results)
    if found is None and "counts" in problems:
        found = (
            "FAIL: dispatch must return the received rows, then one count per local "
            "expert adding up to those rows, then what combine needs."
        )
    if found is None and "output shape" in problems:
        found = "FAIL: combine must return one output row per row given to dispatch."
    if found is None and "no graph" in problems:
        found = _wrong_gradient(problem, [{} for _ in results])
    found = found or _wrong_output(problem, results)
    found = found or _wrong_gradient(problem, results)
    if found:
        return fail(found)
    sent = [len(e) for e in problem["experts"]]
    return ok(
        f"PASS: {sum(sent)} rows ({', '.join(map(str, sent))} on ranks 0-2) reached "
        "the ranks of their experts, came back in order with the experts' outputs, "
        f"and their gradients came back too (within {CLOSE:.0e}); rank 1's rows all "
        "left it and expert 3 got none."
    )
