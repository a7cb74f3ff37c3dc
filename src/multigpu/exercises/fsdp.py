"""The checker of notebook 14's exercise: the four hooks of one unit
(:func:`check_unit_hooks`) (14)."""

from __future__ import annotations

from typing import Any

import torch

from multigpu.core.train import TrainConfig
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.fsdp.models import TiedFrozenNet
from multigpu.ranks.fsdp import unit_hooks_rank
from multigpu.runtime.launch import DEFAULT_TIMEOUT_S, WorkerError, spawn
from multigpu.zero import make_data, train_one_process_adam

# ------------------------------------------------------ the hooks of one unit
HOOKS_CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.05)  # 41 samples: 6 steps
HOOKS_BOUNDS = {torch.float32: 1e-6, torch.float64: 1e-12}


def _model(seed: int, dtype: torch.dtype) -> TiedFrozenNet:
    """Rank r builds its own from seed r; only rank 0's is the start."""
    torch.manual_seed(seed)
    return TiedFrozenNet().to(dtype)


_STUCK = ("Timed out", "timed out", "Connection closed by peer", "Connection reset")


def _hook_mistake(entry: dict[str, Any], rank: int, world_size: int) -> str:
    """The FAIL for the first hook that left its unit in a wrong state."""
    moment, unit, step = entry["moment"], entry["unit"], entry["step"]
    where = f"(unit {unit}, step {step}, rank {rank} of {world_size})"
    calls = entry.get("calls", [])
    if "raised" in entry and any(sign in entry["raised"] for sign in _STUCK):
        return (
            f"FAIL: in your {moment} hook rank {rank} of {world_size} waited for a "
            f"collective until the timeout (unit {unit}, step {step}): a collective "
            "in your hooks ran on some ranks only, or in another order on some ranks."
        )
    if "raised" in entry:
        why = ""
        if moment.startswith("pre") and not entry["allocated"]:
            if "allocate" not in calls:
                why = (
                    " At that moment the unit's buffer had no memory: a unit starts "
                    "freed, and its memory comes back only when a hook asks for it "
                    "(allocate())."
                )
        elif moment == "post_backward" and "gradient of size" in entry["raised"]:
            why = (
                " A rank keeps the gradient of its own chunk only, the size of its "
                "shard."
            )
        return f"FAIL: your {moment} hook raised {entry['raised']} {where}.{why}"
    if entry["shard changed"]:
        return (
            f"FAIL: your {moment} hook changed the unit's shard {where}. The shard "
            "is this rank's master weights, which only Adam updates; hooks read it "
            "and send copies of it."
        )
    before = "forward" if moment == "pre_forward" else "backward"
    if moment in ("pre_forward", "pre_backward"):
        if entry["holds"] is None and "free" in calls and "allocate" in calls:
            return (
                f"FAIL: your {moment} hook gathered the unit, then freed it again "
                f"{where}: its {before} runs right after the hook returns and reads "
                "those parameters from memory that is gone."
            )
        if entry["holds"] is None and moment == "pre_backward":
            return (
                f"FAIL: the unit's backward is about to start, but its buffer has no "
                f"memory {where}: its parameters were freed after forward and not "
                "gathered again. Backward needs them: the tensors autograd saved in "
                "forward are views of that buffer."
            )
        if entry["holds"] is None:
            return (
                f"FAIL: the unit is about to compute its forward, but after your "
                f"pre_forward hook its buffer has no memory {where}: its parameters "
                "were never gathered."
            )
        if entry["holds"] == "NaN":
            return (
                f"FAIL: after your {moment} hook the unit's buffer has its memory "
                f"back but holds no parameters (the NaN new memory holds) {where}: "
                f"nothing wrote every rank's shard into it before {before}."
            )
        return (
            f"FAIL: after your {moment} hook the unit's buffer does not hold its "
            f"parameters {where}: the whole unit is every rank's shard, in rank "
            "order, and every rank needs all of it."
        )
    if moment == "post_forward":
        return (
            f"FAIL: the unit is still gathered after its forward {where}: its buffer "
            "keeps its memory until backward, so every unit ends up whole at once "
            "and sharding saves no memory between forward and backward."
        )
    gradient = entry["gradient"]
    if gradient == "none":
        return (
            f"FAIL: after your post_backward hook the unit's shard has no gradient "
            f"{where}, so Adam would skip it."
        )
    if gradient == "sum":
        return (
            f"FAIL: the shard's gradient is the sum of the ranks' gradients, "
            f"{world_size} times their mean {where}: each rank's loss is already a "
            "mean over its own samples, so the ranks' gradients are averaged, not "
            "added."
        )
    if gradient == "own batch only":
        return (
            f"FAIL: the shard's gradient comes from this rank's batch only {where}: "
            "the other ranks' gradients were never added in, so the ranks would "
            "train on different gradients and drift apart."
        )
    if gradient != "mean":
        return (
            f"FAIL: the shard's gradient is not this rank's chunk of the mean "
            f"gradient over the ranks {where}."
        )
    if entry["all-reduce"]:
        return (
            f"FAIL: the gradients are right, but your post_backward hook all-reduced "
            f"the whole unit's gradient {where}: every rank received the sum of every "
            "chunk and kept one. A rank needs only its own chunk of the sum, which "
            "a reduce-scatter delivers with half the traffic of an all-reduce."
        )
    return (
        f"FAIL: the unit is still gathered after its backward {where}: its buffer "
        "keeps its memory until the next forward."
    )


def check_unit_hooks(hooks: Any, timeout: float = DEFAULT_TIMEOUT_S) -> ExerciseResult:
    """Train a model with a tied, a frozen and an unused layer on 2 and 3 ranks,
    float32 and float64, with each unit's life left to ``hooks`` (a class with
    pre_forward, post_forward, pre_backward and post_backward, from an importable
    module): does each hook leave its unit as it must, and do the weights equal
    one process's? (passed, the first mistake named) (14)."""
    importable_or_raise(hooks, "hooks class", "class")
    X, y = make_data(41, in_features=6, num_classes=3, dtype=torch.float64, seed=1)
    dtypes = tuple(HOOKS_BOUNDS)
    references = {  # rank 0's model, the one every rank starts from: one process
        t: train_one_process_adam(_model(0, t), X.to(t), y, HOOKS_CONFIG)
        for t in dtypes
    }
    order: list[dict[str, Any]] = []
    for world_size in (2, 3):  # 113 trainable parameters: uneven chunks on 3
        models = {t: [_model(r, t) for r in range(world_size)] for t in dtypes}
        runs = [(models[t], X.to(t), y, HOOKS_CONFIG) for t in dtypes]
        try:
            ranks = spawn(unit_hooks_rank, world_size, hooks, runs, timeout=timeout)
        except WorkerError as error:
            if error.timed_out or "collective mismatch" in str(error):
                return fail(
                    f"FAIL: on {world_size} ranks the ranks waited for each other "
                    "until the timeout: a collective in your hooks ran on some "
                    "ranks only, or in another order on some ranks."
                )
            return fail(
                f"FAIL: your hooks raised on rank {error.rank} of {world_size}: "
                f"{last_line(error)}"
            )
        mistakes = [
            (report["mistake"], rank)
            for rank, reports in enumerate(ranks)
            for report in reports
            if report["mistake"]
        ]
        if mistakes:  # a rank whose hook left a wrong state, before one that raised
            entry, rank = min(mistakes, key=lambda found: "raised" in found[0])
            return fail(_hook_mistake(entry, rank, world_size))
        for dtype in dtypes:
            expected = references[dtype].parameters
            for rank, reports in enumerate(ranks):
                got = reports[dtypes.index(dtype)]["parameters"]
                gap = max((got[n] - expected[n]).abs().max().item() for n in expected)
                if not gap <= HOOKS_BOUNDS[dtype]:
                    return fail(
                        f"FAIL: every hook left its unit as it should, but after "
                        f"training rank {rank}'s weights differ from one process's "
                        f"by {gap:.1e} in {dtype} on {world_size} ranks (at most "
                        f"{HOOKS_BOUNDS[dtype]:.0e} expected)."
                    )
        order = order or ranks[0][0]["log"]
        peak = max(report["peak gathered units"] for r in ranks for report in r)
    life = "; ".join(f"{e['moment']} {e['unit']}" for e in order[:4])
    return ok(
        "PASS: on 2 and 3 ranks, in float32 and float64, your hooks train like one "
        "process (within 1e-06 and 1e-12), with a tied, a frozen and an unused "
        "layer. Every unit is gathered before its forward, freed after it, gathered "
        "again before its backward, freed after it, and its gradient reaches the "
        f"shards as the mean over the ranks; at most {peak} "
        f"{'unit' if peak == 1 else 'units'} gathered at a time. Rank 0's first step "
        f"began: {life}; ..."
    )
