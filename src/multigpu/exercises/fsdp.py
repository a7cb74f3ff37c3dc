"""The checkers of notebook 14's exercises: the prefetch
(:func:`check_prefetch`) and the casts around the collectives
(:func:`check_mixed_precision`) (14)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from multigpu.costmodel import (
    all_gather_bytes_per_rank,
    reduce_scatter_bytes_per_rank,
)
from multigpu.ranks.fsdp import mixed_precision_exercise_rank
from multigpu.runtime.launch import spawn
from multigpu.zero import shard_of

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
            "arrived. Call .wait() on the handle of wrapper.issue_gather(order"
            "[position]) after issuing the prefetches."
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
            "that computes now would wait behind a prefetch. Issue order[position] "
            "first."
        )
    extra = [unit for unit in issues if unit != own and unit not in window]
    missing = [u for u in window if u not in issued and u not in issues]
    if missing:
        instead = f" (you issued unit {extra[0]} instead)" if extra else ""
        return (
            f"FAIL: {where} the all-gather of unit {missing[0]}, one of the next "
            f"{depth} in order, was not issued{instead}, so that unit will wait for "
            "its parameters. Issue order[position + 1 : position + 1 + wrapper.depth]."
        )
    if extra:
        return (
            f"FAIL: {where} you issued unit {extra[0]}'s all-gather, which is not "
            f"among the next {depth} units in order. A prefetch beyond wrapper.depth "
            "holds one more gathered unit in memory, and one behind has already "
            "computed. Issue order[position + 1 : position + 1 + wrapper.depth] only."
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
                "stay float32 for Adam. Cast a copy, shard.detach().to(full.dtype), "
                "and send that."
            )
        if "gather_error" in report:
            return False, (
                f"FAIL: gather_parameters raised {report['gather_error']} Cast this "
                "rank's shard to full.dtype (bfloat16) before all_gather: the chunk "
                "sent must have the dtype of the buffer it lands in."
            )
        if report["gather_sent"] == fp32:
            return False, (
                f"FAIL: rank {rank} sent {fp32} bytes in the all-gather, 4 per number: "
                "you gathered in float32 and cast after. Cast the shard to "
                f"full.dtype first, then all_gather; that sends {bf16} bytes."
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
                "of mantissa. Cast full_grad to shard_grad.dtype (float32) first."
            )
        if torch.equal(got, expected * 2):
            return False, (
                "FAIL: shard_grad is the sum of the ranks' gradients, not their mean: "
                "divide it by dist.get_world_size() after the reduce-scatter."
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
