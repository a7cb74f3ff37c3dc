"""The ranks of notebook 17 and the launchers that start them (17).

:func:`attention_rank` runs ring or Ulysses attention forward and backward on this
rank's tokens, one case after the other; :func:`run_attention` starts it once for
many cases. :func:`simple_ring_rank` runs the short ring without a mask
(:func:`run_simple_ring`); :func:`all_to_all_rank` shows Ulysses' all-to-all on a
labelled table (:func:`run_all_to_all`). :func:`block_rank` trains one step of a
self-attention block under context parallelism (ranks from their own seeds, then
rank 0's weights); :func:`run_block_steps` starts it.
:func:`torch_context_parallel_rank` tries PyTorch's own ``context_parallel`` on
this rank; :func:`run_torch_context_parallel` starts it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multigpu.context_parallel import (
    AttentionCase,
    AttentionRun,
    attention_step,
    broadcast_parameters,
    cp_block_step,
    make_attention_block,
    merge_attention_results,
    sequence_to_heads,
    shard_sequence,
    simple_ring_attention,
    torch_context_parallel_attention,
    unshard_sequence,
)
from multigpu.runtime.launch import SLOW_TIMEOUT_S, spawn

__all__ = [
    "all_to_all_rank",
    "attention_rank",
    "block_rank",
    "run_all_to_all",
    "run_attention",
    "run_block_steps",
    "run_simple_ring",
    "run_torch_context_parallel",
    "simple_ring_rank",
    "torch_context_parallel_rank",
]


def attention_rank(
    rank: int, world_size: int, cases: Sequence[AttentionCase]
) -> list[dict]:
    """Rank function: forward and backward of each case on this rank's tokens;
    per case its pieces and record (17)."""
    return [attention_step(case) for case in cases]


def run_attention(
    cases: Sequence[AttentionCase], world_size: int, timeout: float = SLOW_TIMEOUT_S
) -> list[AttentionRun]:
    """Start ``world_size`` ranks once and run every case; each case's results in
    sequence order. A case the scheme cannot split is refused here, by name,
    before any rank starts (17)."""
    for case in cases:
        case.check(world_size)
    per_rank = spawn(attention_rank, world_size, list(cases), timeout=timeout)
    return [
        merge_attention_results(case, [ranks[i] for ranks in per_rank])
        for i, case in enumerate(cases)
    ]


def simple_ring_rank(
    rank: int, world_size: int, cases: Sequence[AttentionCase]
) -> list[torch.Tensor]:
    """Rank function: :func:`~multigpu.context_parallel.simple_ring_attention` on
    this rank's contiguous tokens of each case; its output per case (17)."""
    pieces = (
        [shard_sequence(t, "contiguous", world_size, rank) for t in (c.q, c.k, c.v)]
        for c in cases
    )
    return [simple_ring_attention(q, k, v) for q, k, v in pieces]


def run_simple_ring(
    cases: Sequence[AttentionCase], world_size: int, timeout: float = SLOW_TIMEOUT_S
) -> list[torch.Tensor]:
    """Start ``world_size`` ranks once and run the short ring on every case
    (no mask, a length that ``world_size`` divides); each output in sequence
    order (17)."""
    for case in cases:
        if case.causal or case.q.shape[2] % world_size:
            raise ValueError(
                "the short ring takes no mask and the same number of tokens on "
                f"every rank; got causal={case.causal} and {case.q.shape[2]} "
                f"tokens on {world_size} ranks. Use run_attention, whose ring "
                "takes both."
            )
    per_rank = spawn(simple_ring_rank, world_size, list(cases), timeout=timeout)
    return [
        unshard_sequence([ranks[i] for ranks in per_rank], "contiguous", c.q.shape[2])
        for i, c in enumerate(cases)
    ]


def all_to_all_rank(
    rank: int, world_size: int, seq_len: int, heads: int
) -> dict[str, torch.Tensor]:
    """Rank function: this rank's tokens of a (tokens, heads) table whose entry is
    10·token + head, before and after Ulysses' all-to-all
    (:func:`~multigpu.context_parallel.sequence_to_heads`); each as (tokens,
    heads) (17)."""
    tokens = torch.arange(seq_len)[:, None] * 10 + torch.arange(heads)[None, :]
    table = tokens.T[None, :, :, None].double()  # (batch 1, heads, seq, d 1)
    mine = shard_sequence(table, "contiguous", world_size, rank)
    after = sequence_to_heads(mine, seq_len)  # (1, heads / n, seq, 1)
    return {
        "before": mine[0, :, :, 0].T.long(),
        "after": after[0, :, :, 0].T.long(),
    }


def run_all_to_all(
    seq_len: int, heads: int, world_size: int, timeout: float = SLOW_TIMEOUT_S
) -> list[dict[str, torch.Tensor]]:
    """Start ``world_size`` ranks and run :func:`all_to_all_rank`; every rank's
    tables (17)."""
    return spawn(all_to_all_rank, world_size, seq_len, heads, timeout=timeout)


def block_rank(rank: int, world_size: int, steps: Sequence[dict]) -> list[dict]:
    """Rank function: for each step (the keywords of ``make_attention_block`` and
    of ``cp_block_step``), build the block from ``seed + rank``, take rank 0's
    weights, and run one step on this rank's tokens (17)."""
    results = []
    for step in steps:
        block = make_attention_block(
            step["hidden"], step["heads"], step["x"].dtype, step["seed"] + rank,
            step.get("frozen", ()),
        )  # fmt: skip
        broadcast_parameters(block)
        results.append(
            cp_block_step(
                block,
                step["x"],
                step["target"],
                step["causal"],
                step.get("scheme", "ring"),
                step.get("layout", "contiguous"),
            )  # fmt: skip
        )
    return results


def run_block_steps(
    steps: Sequence[dict], world_size: int, timeout: float = SLOW_TIMEOUT_S
) -> list[list[dict]]:
    """Start ``world_size`` ranks once and run every step; per step, every rank's
    result (17)."""
    per_rank = spawn(block_rank, world_size, list(steps), timeout=timeout)
    return [[ranks[i] for ranks in per_rank] for i in range(len(steps))]


def torch_context_parallel_rank(
    rank: int,
    world_size: int,
    case: AttentionCase,
    backend: str,
    catch: bool = False,
) -> dict:
    """Rank function: PyTorch's ``context_parallel`` on ``case`` with SDPA's
    ``backend`` ("default" or "math"); ``catch``: return its error instead of
    raising (17)."""
    try:
        return torch_context_parallel_attention(case, backend)
    except (NotImplementedError, RuntimeError) as error:
        if not catch:
            raise
        return {"error": f"{type(error).__name__}: {error}"}


def run_torch_context_parallel(
    case: AttentionCase,
    backend: str,
    world_size: int = 2,
    timeout: float = SLOW_TIMEOUT_S,
) -> list[dict]:
    """Start ``world_size`` ranks and run PyTorch's ``context_parallel`` on
    ``case`` with SDPA's ``backend``; every rank's result, or the ranks' error as
    a WorkerError (17)."""
    return spawn(
        torch_context_parallel_rank, world_size, case, backend, timeout=timeout
    )
