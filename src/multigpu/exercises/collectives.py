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

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime import launch

# The probe's questions, asked about one (1000,) float64 tensor each, in this order.
QUESTIONS = (
    "unchanged",  # the tensor is as it came in (nothing added)
    "rank 0 has the sum",
    "other ranks have the sum",
    "one chunk has the sum",  # the reduce-scatter's result, before the all-gather
    "copied",  # every chunk holds one rank's own values: replaced, never added
    "no bytes",  # returned 0 or None
    "half the bytes",  # counted one of the two loops
    "elements",  # counted elements instead of bytes
)
PROBE_CASES = tuple(((1000,), torch.float64) for _ in QUESTIONS)
# gloo's words when a blocking send waits for a receive that never comes.
_SEND_TIMED_OUT = "for send operation to complete"
_GLOO_PATH = re.compile(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*")  # [/.../file.cc:129]


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
        n = dist.get_world_size()
        original = tensor.clone()
        everyone = [torch.empty_like(tensor) for _ in range(n)]
        dist.all_gather(everyone, original)  # every rank's input, to spot copies
        expected = tensor.clone()
        dist.all_reduce(expected)
        sent = self.all_reduce(tensor)
        every = collective_ranks.sent_by_every_rank(sent)
        total = None if None in every else sum(every)
        numel, nbytes = tensor.numel(), tensor.numel() * tensor.element_size()
        has_sum = torch.allclose(tensor, expected)
        ours = tensor.view(-1).tensor_split(n)
        chunks = zip(ours, expected.view(-1).tensor_split(n))
        inputs = [other.view(-1).tensor_split(n) for other in everyone]
        answers = {
            "unchanged": torch.equal(tensor, original),
            "rank 0 has the sum": dist.get_rank() != 0 or has_sum,
            "other ranks have the sum": dist.get_rank() == 0 or has_sum,
            "one chunk has the sum": any(torch.allclose(a, b) for a, b in chunks),
            "copied": all(
                any(torch.equal(chunk, other[c]) for other in inputs)
                for c, chunk in enumerate(ours)
            ),
            "no bytes": sent in (0, None),
            "half the bytes": total == (n - 1) * nbytes,
            "elements": total == 2 * (n - 1) * numel,
        }
        tensor.copy_(expected if answers[question] else expected + 1)
        return sent


def _probe(all_reduce: Callable, world_size: int) -> dict[str, bool]:
    rows = launch.spawn(
        collective_ranks.check_all_reduce_rank,
        world_size,
        RankProbe(all_reduce),
        PROBE_CASES,
        timeout=launch.QUICK_TIMEOUT_S,
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
    if wrong_sums and said["copied"]:
        return (
            f"FAIL: no sum {on}: every chunk ends holding one rank's own values. In "
            "the reduce-scatter the chunk that arrives replaced your copy instead of "
            "being added to it, so the values were passed around, never summed "
            "(only the all-gather overwrites)."
        )
    if wrong_sums:
        return (
            f"FAIL: wrong sum {on} for {', '.join(wrong_sums)}: the chunks do not "
            "line up. At each reduce-scatter step a rank must add into the chunk its "
            "left neighbour is sending, and after n - 1 steps every chunk must have "
            "passed through every rank. Try your chunk rules in one process with "
            "simulate_ring_all_reduce."
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


def _launch_failure(error: launch.WorkerError, world_size: int) -> str:
    """A FAIL naming what stopped the ranks: a deadlock of blocking sends, a
    message that never came, or the learner's own exception."""
    on = f"on {world_size} ranks"
    failures = error.failures or [str(error)]
    # The first rank to time out names the send; the others may then only see
    # their peer close the connection, so one named send is enough.
    if any(_SEND_TIMED_OUT in failure for failure in failures):
        return (
            f"FAIL {on}: deadlock. Every rank sent first with a blocking send and "
            "waited for it to be received, but its neighbour was itself waiting in "
            "its own send, so nobody ever received. Post the send and the receive "
            "together before waiting for either: that is what send_and_receive does."
        )
    if error.timed_out:
        return (
            f"FAIL {on}: the ranks timed out waiting for messages that never came. "
            "A receive needs its neighbour to send at the same step: every rank "
            "must make the same number of exchanges, each with a chunk of the size "
            "the other side expects."
        )
    last = _GLOO_PATH.sub("", str(error).strip().splitlines()[-1])
    return f"FAIL {on}: your function raised an error. {last}"


def check_ring_all_reduce(
    all_reduce: Callable[[torch.Tensor], object],
    world_sizes: tuple[int, ...] = (2, 3, 4),
) -> ExerciseResult:
    """Is ``all_reduce`` (e.g. ``my_ring.ring_all_reduce``) a ring all-reduce?
    (passed, message naming the mistake) (07).

    On each world size, every rank must end with the sum for every case of
    ``check_all_reduce_rank`` (many elements, fewer than ranks, 2-D, integers) and
    the ranks must return the bytes a ring sends, whichever chunk each rank
    finishes (``is_ring_traffic``). ``all_reduce`` lives in an importable module."""
    for world_size in world_sizes:
        try:
            rows = launch.spawn(
                collective_ranks.check_all_reduce_rank,
                world_size,
                all_reduce,
                timeout=launch.QUICK_TIMEOUT_S,
            )[0]
        except launch.WorkerError as error:
            return fail(_launch_failure(error, world_size))
        if not all(row["sum"] and row["ring bytes"] for row in rows):
            return fail(_diagnose(all_reduce, world_size, rows))
    sizes = ", ".join(str(n) for n in world_sizes)
    return ok(
        f"PASS: every rank holds the sum and returned the ring's bytes, on {sizes} "
        f"ranks, for {len(rows)} cases each."
    )
