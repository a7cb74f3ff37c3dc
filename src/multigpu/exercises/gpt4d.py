"""The checkers of notebook 19's exercises (19): the groups of a rank grid
(:func:`check_grid_groups`), the refusal of a batch too small for the grid
(:func:`check_batch_problem`) and the groups a gradient is summed over
(:func:`check_sync_dims`).

Each calls the learner's function on probes chosen so that each mistake shows as
its own symptom, in this process (no ranks): a learner's exception is a FAIL that
names it; a function that is, or calls, the package's own answer is refused.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Callable

from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.gpt4d.grid import DIMS, Grid, grid_problem

__all__ = ["SYNC_KINDS", "check_batch_problem", "check_grid_groups", "check_sync_dims"]


def _error(exc: Exception) -> str:
    """The learner's error in one line: its type and message."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _refuse_borrowed(function: object, answers: tuple) -> ExerciseResult | None:
    """A FAIL naming the package function of ``answers`` that ``function`` calls
    (by name, as a method or an attribute), or None."""
    top = getattr(function, "__code__", None)
    codes, used = [top] if top else [], set()
    while codes:  # the function's code and the code of what it defines inside
        code = codes.pop()
        used |= set(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    scope = getattr(function, "__globals__", {})
    for answer in answers:
        name = answer.__name__
        if function is answer or name in used and scope.get(name) is not function:
            return fail(
                f"FAIL: your function hands the work to the package's own {name}, so "
                "this would check the package, not your code."
            )
    return None


# Grids whose sizes all differ, so that a stride taken from the wrong dimension shows.
_PROBE_GRIDS = (
    Grid(dp=2, tp=3, pp=1, cp=1),
    Grid(dp=3, tp=2, pp=2, cp=1),
    Grid(dp=2, tp=2, pp=3, cp=2),
    Grid(),
)


def check_grid_groups(
    my_groups: Callable[[Grid, str], list[list[int]]],
) -> ExerciseResult:
    """``my_groups(grid, dim)`` returns every group along ``dim`` (ranks that
    differ only in ``dim``, in the order of their ``dim`` coordinate) (19)."""
    borrowed = _refuse_borrowed(my_groups, (Grid.groups, Grid.tied_groups))
    if borrowed:
        return borrowed
    for grid in _PROBE_GRIDS:
        for dim in DIMS:
            try:
                got = [list(g) for g in my_groups(grid, dim)]
            except Exception as exc:  # the learner's error is the verdict
                return fail(f"FAIL: my_groups({grid}, {dim!r}) raised {_error(exc)}")
            where = f"on {grid.label()} along {dim}"
            seen = Counter(r for g in got for r in g)
            if set(seen) != set(range(grid.world_size)) or max(seen.values()) > 1:
                return fail(
                    f"FAIL: {where}, the groups do not hold every rank exactly once: "
                    "the groups of one dimension split the world."
                )
            for group in got:
                coords = [grid.coords(r) for r in group]
                others = {tuple(c[d] for d in DIMS if d != dim) for c in coords}
                if len(others) > 1 or len(group) != getattr(grid, dim):
                    return fail(
                        f"FAIL: {where}, group {group} holds ranks that differ in "
                        f"another coordinate than {dim} (or has the wrong size): "
                        "check which dimension each stride belongs to."
                    )
                if [c[dim] for c in coords] != sorted(c[dim] for c in coords):
                    return fail(
                        f"FAIL: {where}, group {group} is not in the order of its "
                        f"{dim} coordinate: a pipeline's stage 0 must come first."
                    )
    return ok(
        "PASS: your groups split the world along each of dp, pp, cp and tp, in "
        "coordinate order, on four grids of different shapes."
    )


def batch_cases() -> list[tuple[str, Grid, int, int, bool]]:
    """(words, grid, batch, micro-batches per replica, whether the step can run it),
    ordered so that each mistake meets its own case first: what check_batch_problem
    plays (19)."""
    full = Grid(dp=2, tp=2, pp=2, cp=2)
    return [
        ("a batch of 8 sequences on dp2 x tp2 x pp2 x cp2", full, 8, 2, True),
        ("an uneven batch of 5 sequences on dp2", Grid(dp=2), 5, 2, True),
        ("a batch of exactly 4 sequences on dp2", Grid(dp=2), 4, 2, True),
        ("a batch of 1 sequence on tp2 x cp2", Grid(tp=2, cp=2), 1, 1, True),
        ("a batch of 3 sequences on dp2", Grid(dp=2), 3, 2, False),
        ("a batch of 2 sequences on dp4", Grid(dp=4), 2, 1, False),
        ("a batch of 2 sequences on one process", Grid(), 2, 4, False),
    ]


def check_batch_problem(
    my_batch_problem: Callable[[Grid, int, int], str | None],
) -> ExerciseResult:
    """``my_batch_problem(grid, batch, microbatches)`` returns why the hand-built
    step cannot cut a global batch of ``batch`` sequences on ``grid`` into
    ``microbatches`` micro-batches per replica (a string), or None (19)."""
    borrowed = _refuse_borrowed(my_batch_problem, (grid_problem,))
    if borrowed:
        return borrowed
    for words, grid, batch, microbatches, works in batch_cases():
        where = f"{words} with {microbatches} micro-batch{'es' * (microbatches > 1)}"
        try:
            answer = my_batch_problem(grid, batch, microbatches)
        except Exception as exc:  # the learner's error is the verdict
            return fail(f"FAIL: on {where} your function raised {_error(exc)}")
        if works and answer is not None:
            return fail(
                f"FAIL: you refuse {where} per replica, which the hand-built step "
                "trains: look again at which dimensions cut the batch, and how."
            )
        if not works and not (isinstance(answer, str) and answer):
            return fail(
                f"FAIL: you accept {where} per replica: some replica would get an "
                "empty micro-batch."
            )
    return ok(
        "PASS: you refuse each batch that leaves a micro-batch empty and accept the "
        "ones the hand-built step can cut, uneven ones included."
    )


SYNC_KINDS = ("layernorm", "column_weight", "embedding")


def _after_sync(grid: Grid, kind: str, dims: list[str]) -> list[Counter]:
    """What each rank's gradient holds after summing over ``dims``: a count of
    each (dp, cp, end, tp-shard) contribution (end: 0 input side, 1 head side)."""

    def held(rank: int) -> Counter:
        c = grid.coords(rank)
        end = 1 if (kind == "embedding" and c["pp"] == grid.pp - 1) else 0
        shard = c["tp"] if kind == "column_weight" else 0
        if kind == "embedding" and grid.pp > 1 and 0 < c["pp"] < grid.pp - 1:
            return Counter()
        return Counter({(c["dp"], c["cp"], end, shard): 1})

    state = {r: held(r) for r in range(grid.world_size)}
    for dim in dims:
        groups = grid.tied_groups() if dim == "tied" else grid.groups(dim)
        new = dict(state)
        for group in groups:
            total = sum((state[r] for r in group), Counter())
            for r in group:
                new[r] = total
        state = new
    return [state[r] for r in range(grid.world_size)]


def check_sync_dims(my_sync_dims: Callable[[str], list[str]]) -> ExerciseResult:
    """``my_sync_dims(kind)`` returns the groups ("dp", "tp", "pp", "cp", "tied")
    a gradient of ``kind`` (one of SYNC_KINDS) is summed over after backward, in
    any order (19)."""
    grid = Grid(dp=2, tp=2, pp=2, cp=2)
    for kind in SYNC_KINDS:
        try:
            dims = list(my_sync_dims(kind))
        except Exception as exc:  # the learner's error is the verdict
            return fail(f"FAIL: my_sync_dims({kind!r}) raised {_error(exc)}")
        unknown = [d for d in dims if d not in (*DIMS, "tied")]
        if unknown:
            return fail(f"FAIL: for {kind}, {unknown} is not a group of the grid.")
        ends = (0, 1) if kind == "embedding" else (0,)
        for rank, got in enumerate(_after_sync(grid, kind, dims)):
            c = grid.coords(rank)
            if kind == "embedding" and 0 < c["pp"] < grid.pp - 1 or not got:
                continue
            shard = c["tp"] if kind == "column_weight" else 0
            if any(key[3] != shard for key in got):
                return fail(
                    f"FAIL: for {kind}, rank {rank}'s gradient now adds another "
                    "tensor-parallel rank's shard: a different slice of the weight."
                )
            if max(got.values()) > 1:
                return fail(
                    f"FAIL: for {kind}, rank {rank}'s gradient counts one "
                    "contribution more than once: it sums over a group whose ranks "
                    "add no new share (the same gradient, or another layer's)."
                )
            want = {
                (d, k, e) for d in range(grid.dp) for k in range(grid.cp) for e in ends
            }
            have = {key[:3] for key in got}
            missing = want - have
            if any(key[1] != c["cp"] for key in missing) and all(
                key[1] == c["cp"] for key in have
            ):
                return fail(
                    f"FAIL: for {kind}, rank {rank}'s gradient misses the tokens "
                    "of the other context-parallel ranks."
                )
            if any(key[0] != c["dp"] for key in missing) and all(
                key[0] == c["dp"] for key in have
            ):
                return fail(
                    f"FAIL: for {kind}, rank {rank}'s gradient misses the other "
                    "data-parallel replicas' samples."
                )
            if missing:
                return fail(
                    f"FAIL: for {kind}, rank {rank}'s gradient misses the other "
                    "copy of the tied weight (the head's or the embedding's side)."
                )
    return ok(
        "PASS: on a 2 x 2 x 2 x 2 grid every gradient holds each replica's, each "
        "context-parallel rank's and each side of the tied weight's share, once."
    )
