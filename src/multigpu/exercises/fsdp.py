"""The checkers of notebook 14: the four hooks of one unit (:func:`check_unit_hooks`,
its exercise), and FSDPByHand's two other replaceable parts, the prefetch
(:func:`check_prefetch`) and the casts around the collectives
(:func:`check_mixed_precision`) (14)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from multigpu.core.train import TrainConfig
from multigpu.costmodel import (
    all_gather_bytes_per_rank,
    reduce_scatter_bytes_per_rank,
)
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.fsdp.models import TiedFrozenNet
from multigpu.ranks.fsdp import mixed_precision_exercise_rank, unit_hooks_rank
from multigpu.runtime.launch import WorkerError, spawn
from multigpu.zero import make_data, shard_of, train_single_process_adam

ORDERS = ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 1])  # forward, backward, any


class _Handle:
    def __init__(self, log: list, unit: int) -> None:
        self.log, self.unit = log, unit

    def wait(self) -> None:
        self.log.append(("wait", self.unit))


class _Recorder:
    """Stands in for FSDPByHand: records what the prefetch function issues and
    waits for; a handle stays issued until its unit has computed."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.log: list[tuple[str, int]] = []
        self.handles: dict[int, _Handle] = {}

    def issue_gather(self, unit: int) -> _Handle:
        if unit not in self.handles:
            self.handles[unit] = _Handle(self.log, unit)
            self.log.append(("issue", unit))
        return self.handles[unit]


def _diagnose(order: list[int], position: int, depth: int, log, issued) -> str | None:
    own = order[position]
    window = order[position + 1 : position + 1 + depth]
    where = f"with depth={depth}, before unit {own} (position {position} of {order})"
    issues = [unit for kind, unit in log if kind == "issue"]
    waits = [unit for kind, unit in log if kind == "wait"]
    if own not in waits:
        return (
            f"FAIL: {where} your function returned without waiting for unit {own}'s "
            "own all-gather, so it would compute on parameters that have not "
            "arrived. The unit about to compute must wait for its own handle, and "
            "only for that one."
        )
    early = [unit for unit in waits if unit != own]
    if early:
        return (
            f"FAIL: {where} you waited for unit {early[0]}'s all-gather right after "
            "issuing it, so nothing overlaps with unit "
            f"{own}'s compute. Keep the prefetched handles without waiting: each "
            "unit waits for its own when it computes."
        )
    if issues and own not in issued and issues[0] != own:
        return (
            f"FAIL: {where} you issued unit {issues[0]}'s all-gather before unit "
            f"{own}'s own. The communication thread runs them in order, so the unit "
            "that computes now would wait behind a prefetch that is needed later."
        )
    extra = [unit for unit in issues if unit != own and unit not in window]
    missing = [u for u in window if u not in issued and u not in issues]
    if missing:
        instead = f" (you issued unit {extra[0]} instead)" if extra else ""
        return (
            f"FAIL: {where} the all-gather of unit {missing[0]}, one of the next "
            f"{depth} in order, was not issued{instead}, so that unit will wait for "
            "its parameters instead of finding them gathered. The prefetched units "
            "are the ones right after this one in order, as many as the depth."
        )
    if extra:
        return (
            f"FAIL: {where} you issued unit {extra[0]}'s all-gather, which is not "
            f"among the next {depth} units in order. A prefetch beyond the depth "
            "holds one more gathered unit in memory than asked for, and a unit "
            "earlier in order has already computed."
        )
    return None


def check_prefetch(prefetch: Callable[..., None]) -> tuple[bool, str]:
    """Run ``prefetch(wrapper, order, position)`` against a recorder for every
    position of a forward, a backward and a mixed order at depths 0 to 2; return
    (passed, message naming the first mistake) (14)."""
    for depth in (1, 2, 0):
        for order in ORDERS:
            wrapper = _Recorder(depth)
            for position, own in enumerate(order):
                wrapper.log = []
                issued = set(wrapper.handles)
                for handle in wrapper.handles.values():
                    handle.log = wrapper.log
                try:
                    prefetch(wrapper, list(order), position)
                except Exception as error:
                    return False, (
                        f"FAIL: with depth={depth} at position {position} of {order} "
                        f"your function raised {type(error).__name__}: {error}"
                    )
                message = _diagnose(list(order), position, depth, wrapper.log, issued)
                if message:
                    return False, message
                wrapper.handles.pop(own)  # it computed; its memory is freed
    return True, (
        "PASS: before each unit computes, your function issues its all-gather, the "
        "next wrapper.depth units' without waiting, and waits for its own only "
        "(forward, backward and another order; depths 0, 1 and 2)."
    )


def _expected(numel: int, world_size: int) -> tuple[torch.Tensor, list]:
    master = torch.linspace(-1, 1, numel, dtype=torch.float32) / 3
    grads = [
        torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(
            torch.bfloat16
        )
        for rank in range(world_size)
    ]
    total = sum(g.float() for g in grads)  # 2 ranks: one addition, any order
    return master, [shard_of(total, r, world_size) / world_size for r in range(2)]


def check_mixed_precision(
    gather: Callable[..., int], reduce: Callable[..., int], numel: int = 13
) -> tuple[bool, str]:
    """Run the learner's ``gather(shard, full)`` and ``reduce(full_grad,
    shard_grad)`` on 2 ranks; return (passed, message naming the first mistake)
    (14)."""
    reports = spawn(mixed_precision_exercise_rank, 2, gather, reduce, numel, timeout=60)
    master, mean_chunks = _expected(numel, 2)
    for report in reports:
        rank = report["rank"]
        fp32 = all_gather_bytes_per_rank(numel, 4, 2, rank)
        bf16 = all_gather_bytes_per_rank(numel, 2, 2, rank)
        if not torch.equal(report["shard_after"], shard_of(master, rank, 2)):
            return False, (
                "FAIL: the master shard changed (its dtype or its values): it must "
                "stay float32 for Adam. What travels is a bfloat16 copy of it; the "
                "shard itself is never cast."
            )
        if "gather_error" in report:
            error = _first_sentence(report["gather_error"])
            return False, (
                f"FAIL: gather_parameters raised {error} The chunk a rank sends "
                "must already have the dtype of the buffer it lands in (bfloat16): "
                "all_gather does not cast."
            )
        if report["gather_sent"] == fp32:
            return False, (
                f"FAIL: rank {rank} sent {fp32} bytes in the all-gather, 4 per number: "
                "you gathered in float32 and cast after, so the wire carried float32. "
                f"Cast before sending and the ring carries {bf16} bytes."
            )
        if report["gather_sent"] != bf16 or not torch.equal(
            report["full"], master.to(torch.bfloat16)
        ):
            return False, (
                "FAIL: full is not every rank's shard cast to bfloat16, or rank "
                f"{rank} did not report the bytes all_gather returned ({bf16} "
                "expected)."
            )
        if "reduce_error" in report:
            return False, f"FAIL: reduce_gradient raised {report['reduce_error']}"
        expected = mean_chunks[rank]
        got = report["shard_grad"]
        if report["reduce_sent"] == reduce_scatter_bytes_per_rank(numel, 2, 2, rank):
            return False, (
                "FAIL: the reduce-scatter sent 2 bytes per number: you reduced the "
                "gradient in bfloat16, so every addition of the ring rounds to 8 bits "
                "of precision (7 stored). The sum must be taken in the master dtype, "
                "float32."
            )
        if torch.equal(got, expected * 2):
            return False, (
                "FAIL: shard_grad is the sum of the ranks' gradients, not their mean: "
                "each rank's gradient is already a mean over its own samples, so the "
                "ranks' gradients must be averaged, not added."
            )
        sent = reduce_scatter_bytes_per_rank(numel, 4, 2, rank)
        if report["reduce_sent"] != sent or not torch.equal(got, expected):
            return False, (
                f"FAIL: rank {rank}'s shard_grad is not its chunk of the mean "
                f"gradient reduced in float32, or it did not report the {sent} bytes "
                "reduce_scatter returned."
            )
    return True, (
        "PASS: each rank casts its shard to bfloat16 before the all-gather (2 bytes "
        "a number), keeps its float32 master, and reduces the gradient in float32 "
        "(4 bytes a number) to the mean of the ranks."
    )


def _first_sentence(text: str) -> str:
    """A rank's error up to its first full stop: what went wrong, not the fix
    the library's message may go on to suggest."""
    return text.split(". ")[0].rstrip(".") + "."


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


def check_unit_hooks(hooks: Any, timeout: float = 30.0) -> tuple[bool, str]:
    """Train a model with a tied, a frozen and an unused layer on 2 and 3 ranks,
    float32 and float64, with each unit's life left to ``hooks`` (a class with
    pre_forward, post_forward, pre_backward and post_backward, from an importable
    module): does each hook leave its unit as it must, and do the weights equal
    one process's? (passed, the first mistake named) (14)."""
    importable_or_raise(hooks, "hooks class", "class")
    X, y = make_data(41, in_features=6, num_classes=3, dtype=torch.float64, seed=1)
    dtypes = tuple(HOOKS_BOUNDS)
    references = {  # rank 0's model, the one every rank starts from: one process
        t: train_single_process_adam(_model(0, t), X.to(t), y, HOOKS_CONFIG)
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
                return False, (
                    f"FAIL: on {world_size} ranks the ranks waited for each other "
                    "until the timeout: a collective in your hooks ran on some "
                    "ranks only, or in another order on some ranks."
                )
            return False, (
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
            return False, _hook_mistake(entry, rank, world_size)
        for dtype in dtypes:
            expected = references[dtype].parameters
            for rank, reports in enumerate(ranks):
                got = reports[dtypes.index(dtype)]["parameters"]
                gap = max((got[n] - expected[n]).abs().max().item() for n in expected)
                if not gap <= HOOKS_BOUNDS[dtype]:
                    return False, (
                        f"FAIL: every hook left its unit as it should, but after "
                        f"training rank {rank}'s weights differ from one process's "
                        f"by {gap:.1e} in {dtype} on {world_size} ranks (at most "
                        f"{HOOKS_BOUNDS[dtype]:.0e} expected)."
                    )
        order = order or ranks[0][0]["log"]
        peak = max(report["peak gathered units"] for r in ranks for report in r)
    life = "; ".join(f"{e['moment']} {e['unit']}" for e in order[:4])
    return True, (
        "PASS: on 2 and 3 ranks, in float32 and float64, your hooks train like one "
        "process (within 1e-06 and 1e-12), with a tied, a frozen and an unused "
        "layer. Every unit is gathered before its forward, freed after it, gathered "
        "again before its backward, freed after it, and its gradient reaches the "
        f"shards as the mean over the ranks; at most {peak} "
        f"{'unit' if peak == 1 else 'units'} gathered at a time. Rank 0's first step "
        f"began: {life}; ..."
    )
