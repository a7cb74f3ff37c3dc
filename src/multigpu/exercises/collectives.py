"""The checker of notebook 07's exercise, where the learner writes the ring
all-reduce (07).

:func:`check_ring_all_reduce` runs the learner's function with
:func:`multigpu.ranks.collectives.check_all_reduce_rank` on 2, 3 and 4 ranks. That
rank function answers one question per case for all ranks at once (the sum and the
bytes, each true only if true on every rank), so when a case fails the checker
launches once more with a probe: a wrapper around the learner's function that turns
one question about one rank ("does rank 0 hold the sum?", "did it return 0
bytes?") into the "sum" answer, so the failure can be named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from multigpu.costmodel import ring_bytes_per_rank
from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime import launch

# The probe's questions, asked about one (1000,) float64 tensor each, in this order.
QUESTIONS = (
    "unchanged",  # the tensor is as it came in (nothing added)
    "rank 0 has the sum",
    "other ranks have the sum",
    "one chunk has the sum",  # the reduce-scatter's result, before the all-gather
    "no bytes",  # returned 0 or None
    "half the bytes",  # counted one of the two loops
    "elements",  # counted elements instead of bytes
)
PROBE_CASES = tuple(((1000,), torch.float64) for _ in QUESTIONS)
HOW_TO_INDEX = (
    "at reduce-scatter step s rank r sends chunk (r - s) % n and adds the one from "
    "the left into chunk (r - 1 - s) % n"
)


@dataclass
class RankProbe:
    """The learner's all-reduce, answering question ``QUESTIONS[call]`` about this
    rank at the call-th call: the tensor ends as the sum if the answer is yes and as
    the sum + 1 if not, so ``check_all_reduce_rank``'s "sum" is the answer on every
    rank (07)."""

    all_reduce: Callable[[torch.Tensor], object]
    calls: int = field(default=0)

    def __call__(self, tensor: torch.Tensor) -> object:
        question = QUESTIONS[self.calls]
        self.calls += 1
        original = tensor.clone()
        expected = tensor.clone()
        dist.all_reduce(expected)
        sent = self.all_reduce(tensor)
        n, rank = dist.get_world_size(), dist.get_rank()
        ring = ring_bytes_per_rank(tensor.numel(), tensor.element_size(), n, rank)
        has_sum = torch.allclose(tensor, expected)
        chunks = zip(tensor.view(-1).tensor_split(n), expected.view(-1).tensor_split(n))
        answers = {
            "unchanged": torch.equal(tensor, original),
            "rank 0 has the sum": rank != 0 or has_sum,
            "other ranks have the sum": rank == 0 or has_sum,
            "one chunk has the sum": any(torch.allclose(a, b) for a, b in chunks),
            "no bytes": sent in (0, None),
            "half the bytes": sent == ring // 2,
            "elements": sent == ring // tensor.element_size(),
        }
        tensor.copy_(expected if answers[question] else expected + 1)
        return sent


def _probe(all_reduce: Callable, world_size: int) -> dict[str, bool]:
    rows = launch.spawn(
        collective_ranks.check_all_reduce_rank,
        world_size,
        RankProbe(all_reduce),
        PROBE_CASES,
        timeout=10,
    )[0]
    return {question: row["sum"] for question, row in zip(QUESTIONS, rows)}


def _diagnose(all_reduce: Callable, world_size: int, rows: list[dict]) -> str:
    on = f"on {world_size} ranks"
    wrong_sums = [row["case"] for row in rows if not row["sum"]]
    said = _probe(all_reduce, world_size)
    if wrong_sums and said["unchanged"]:
        return (
            f"FAIL: the tensor is unchanged {on}: nothing was added. In the "
            "reduce-scatter, add the chunk that arrives from the left into yours."
        )
    if wrong_sums and said["rank 0 has the sum"]:
        return (
            f"FAIL: only rank 0 ends with the sum {on}: every rank must. Send the "
            "finished chunks on around the ring in the all-gather."
        )
    if wrong_sums and said["one chunk has the sum"]:
        return (
            f"FAIL: each rank holds the sum in one chunk only {on}: the all-gather "
            "is missing. Pass each finished chunk around the ring, overwriting yours."
        )
    if wrong_sums:
        return (
            f"FAIL: wrong sum {on} for {', '.join(wrong_sums)}: check the chunk "
            f"indices ({HOW_TO_INDEX})."
        )
    if said["no bytes"]:
        return (
            f"FAIL: the sum is right {on}, but your function returned no bytes: add "
            "what send_and_receive returns to sent, and return sent."
        )
    if said["half the bytes"]:
        return (
            f"FAIL: the sum is right {on}, but you returned half the bytes a ring "
            "sends: count the bytes of both loops (reduce-scatter and all-gather)."
        )
    if said["elements"]:
        return (
            f"FAIL: the sum is right {on}, but you counted elements, not bytes: add "
            "what send_and_receive returns (bytes) to sent."
        )
    return (
        f"FAIL: the sum is right {on}, but the bytes you returned are not the bytes "
        "a ring sends: return the sum of what send_and_receive returned."
    )


def check_ring_all_reduce(
    all_reduce: Callable[[torch.Tensor], object],
    world_sizes: tuple[int, ...] = (2, 3, 4),
) -> tuple[bool, str]:
    """Is ``all_reduce`` (e.g. ``my_ring.ring_all_reduce``) a ring all-reduce?
    (passed, message naming the mistake) (07).

    On each world size, every rank must end with the sum for every case of
    ``check_all_reduce_rank`` (many elements, fewer than ranks, 2-D, integers) and
    return the bytes a ring sends. ``all_reduce`` lives in an importable module."""
    for world_size in world_sizes:
        try:
            rows = launch.spawn(
                collective_ranks.check_all_reduce_rank,
                world_size,
                all_reduce,
                timeout=10,
            )[0]
        except launch.WorkerError as error:
            last = str(error).strip().splitlines()[-1]
            return False, (
                f"FAIL on {world_size} ranks: {last}. Every rank must call "
                "send_and_receive the same number of times, with chunks of matching "
                "sizes (receive into buffer[: ours.numel()])."
            )
        if not all(row["sum"] and row["ring bytes"] for row in rows):
            return False, _diagnose(all_reduce, world_size, rows)
    sizes = ", ".join(str(n) for n in world_sizes)
    return True, (
        f"PASS: every rank holds the sum and returned the ring's bytes, on {sizes} "
        f"ranks, for {len(rows)} cases each."
    )
