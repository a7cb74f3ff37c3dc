"""Checkers for notebook 20: the collectives of an FSDP2 x TP step counted on a
fake mesh, and the grids a planner may consider (20)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from multigpu.exercises._result import ExerciseResult, fail, ok

# (blocks, dp, tp): one of each kind, including no FSDP and no TP
COUNT_CASES = ((1, 2, 2), (3, 2, 4), (2, 4, 1), (2, 1, 4), (2, 8, 8))


def _call(function: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """The learner's result, or None and their error in one line."""
    try:
        return function(*args), None
    except Exception as error:  # the learner's code: any error is a FAIL
        return None, f"{type(error).__name__}: {error}".splitlines()[0]


@functools.cache
def _counted(dp: int, tp: int, blocks: int) -> dict[str, int]:
    """CommDebugMode's counts of one step on a fake mesh (the same every time)."""
    from multigpu.cluster.fake import mlp_step_collectives

    return mlp_step_collectives((dp, tp), blocks)


def _nonzero(counts: dict) -> dict:
    return {name: n for name, n in counts.items() if n}


def check_collectives_per_step(
    collectives_per_step: Callable[[int, int, int], dict[str, int]],
) -> ExerciseResult:
    """``collectives_per_step(blocks, dp, tp)`` must return what ``CommDebugMode``
    counts in one forward and backward of that many MLP blocks under FSDP2 x TP on a
    fake (dp, tp) mesh; names the kind of collective that is off (20)."""
    for blocks, dp, tp in COUNT_CASES:
        where = f"{blocks} blocks on a ({dp}, {tp}) mesh"
        value, error = _call(collectives_per_step, blocks, dp, tp)
        if error:
            return fail(f"FAIL: for {where} your function raised {error}.")
        if not isinstance(value, dict):
            return fail(f"FAIL: for {where} return a dict, not {value!r}.")
        counted = _counted(dp, tp, blocks)
        mine = _nonzero(value)
        for name in sorted(set(counted) | set(mine)):
            want, got = counted.get(name, 0), mine.get(name, 0)
            if want != got:
                return fail(_explain(name, got, want, where, dp, tp))
    return ok("PASS: every count matches what CommDebugMode counted on a fake mesh.")


def _explain(name: str, got: int, want: int, where: str, dp: int, tp: int) -> str:
    base = f"FAIL: {where}: you count {got} {name}, the step issues {want}."
    if name == "all-gather (FSDP)" and want and got == want // 2:
        return base + " Forward is not the only time a unit needs its parameters."
    if name.endswith("(FSDP)") and dp == 1:
        return base + " What does FSDP2 have to exchange with a group of one rank?"
    if name.endswith("(FSDP)") and got > want:
        return base + " Does the root unit hold any parameters of its own here?"
    if name == "all-reduce (TP)" and tp == 1:
        return base + " What does TP have to exchange with a group of one rank?"
    if name == "all-reduce (TP)" and got == want + 1:
        return base + " Does the first block's input need a gradient?"
    if name == "all-reduce (TP)":
        return base + " Count forward (row-parallel outputs) and backward apart."
    return base


def check_valid_grids(
    valid_grids: Callable[..., list[tuple[int, int, int, int]]],
) -> ExerciseResult:
    """``valid_grids(shape, gpus, global_batch, seq_len, devices_per_node)`` must
    return the same set of (dp, tp, pp, cp) as the planner's rules; names the rule
    a wrong grid breaks (20)."""
    from multigpu.cluster.llama import LLAMA3_8B, LLAMA3_70B
    from multigpu.cluster.planner import valid_grids as reference

    borrowed = getattr(valid_grids, "__code__", None)
    names = set(borrowed.co_names) if borrowed else set()
    if (
        valid_grids is reference
        or "valid_grids" in names
        or "plan_configurations" in names
    ):
        return fail(
            "FAIL: your function hands the work to the planner's own valid_grids, so "
            "this would check the package, not your code."
        )
    cases = ((LLAMA3_8B, 64, 32, 8192, 8), (LLAMA3_70B, 48, 24, 4096, 6))
    for shape, gpus, batch, seq_len, node in cases:
        where = f"{shape.name}, {gpus} GPUs, batch {batch}, {node} GPUs a node"
        value, error = _call(valid_grids, shape, gpus, batch, seq_len, node)
        if error:
            return fail(f"FAIL: for {where} your function raised {error}.")
        try:
            mine = {tuple(int(n) for n in grid) for grid in value}
        except (TypeError, ValueError):
            return fail(f"FAIL: return (dp, tp, pp, cp) tuples, not {value!r}.")
        want = set(reference(shape, gpus, batch, seq_len, node))
        extra, missing = sorted(mine - want), sorted(want - mine)
        if extra:
            return fail(_broken_rule(extra[0], shape, gpus, batch, seq_len, node))
        if missing:
            return fail(f"FAIL: {where}: you leave out {missing[0]}, which is valid.")
    return ok("PASS: your grids are exactly the ones the planner's rules allow.")


def _broken_rule(grid, shape, gpus, batch, seq_len, node) -> str:
    dp, tp, pp, cp = grid
    start = f"FAIL: {grid} (dp, tp, pp, cp) is not a valid grid:"
    if dp * tp * pp * cp != gpus:
        return f"{start} its ranks do not add up to the GPUs you have."
    if tp > node:
        return f"{start} its tensor-parallel group leaves the node."
    if shape.kv_heads % tp:
        return f"{start} the key/value heads cannot be split that way."
    if shape.layers % pp:
        return f"{start} the layers cannot be split into that many stages."
    if batch % dp or seq_len % cp:
        return f"{start} the batch or the sequence cannot be split that way."
    if pp > 1 and batch // dp < pp:
        return f"{start} the pipeline has fewer micro-batches than stages."
    return f"{start} it breaks a rule of the planner (cp at most 8?)."
