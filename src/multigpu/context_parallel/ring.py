"""Ring attention: the keys and values travel around the ring of ranks (17).

Each rank holds its tokens' queries, keys and values, laid out as
:mod:`~multigpu.context_parallel.layout` says. At step i (of n) rank r holds the
key/value block of rank (r - i) mod n: it computes its queries' partial attention
over that block and merges it into its running result
(:func:`~multigpu.context_parallel.merge_partials`), while the block travels on to
rank r + 1 and the next one arrives from rank r - 1 (posted before the compute,
waited on after it, so that the message and the compute overlap). After n steps
every query has seen every key: the result equals one process's attention.

Under a causal mask each (query chunk, key chunk) pair is skipped, computed whole or
computed with a mask (:func:`~multigpu.context_parallel.causal_block_kind`); the
record counts them per rank.

The backward sends the blocks around again, each with the gradients of its keys
and values accumulating as it goes; one more step brings those gradients home
(Liu et al. 2023, "Ring Attention with Blockwise Transformers", arXiv:2310.01889).
:func:`simulate_ring_attention` plays the same forward in one process, rank by
rank, for the exercises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from multigpu.context_parallel.attention import (
    block_attention,
    block_attention_backward,
    causal_block_kind,
    merge_partials,
)
from multigpu.context_parallel.layout import layout_chunks

__all__ = [
    "BlockRecord",
    "RingAttention",
    "RingRecord",
    "attend_to_block",
    "ring_attention",
    "ring_attention_backward",
    "ring_attention_forward",
    "simple_ring_attention",
    "simulate_ring_attention",
]

Merge = Callable[..., tuple[torch.Tensor, torch.Tensor]]
BlockKind = Callable[[range, range], str]


@dataclass(frozen=True)
class BlockRecord:
    """One (query chunk, key chunk) pair a rank met at one step of the ring."""

    step: int
    source: int  # the rank whose keys and values these are
    queries: range
    keys: range
    kind: str  # "skip", "full" or "causal"


@dataclass
class RingRecord:
    """What one rank did in ring attention: its blocks and the bytes it sent."""

    rank: int = 0
    blocks: list[BlockRecord] = field(default_factory=list)
    forward_bytes: int = 0
    backward_bytes: int = 0

    def counts(self) -> dict[str, int]:
        """Forward blocks by kind: {"full": .., "causal": .., "skip": ..}."""
        kinds = [block.kind for block in self.blocks]
        return {kind: kinds.count(kind) for kind in ("full", "causal", "skip")}

    def scores_computed(self) -> int:
        """Query-key products computed in forward: every product of a block that is
        not skipped, the masked ones of a block on the diagonal included."""
        return sum(
            len(b.queries) * len(b.keys) for b in self.blocks if b.kind != "skip"
        )

    def scores_needed(self) -> int:
        """Query-key products the attention needs: the pairs a causal mask lets
        through (key position <= query position) in the blocks met; all of them
        without a mask."""
        return sum(_needed(b) for b in self.blocks)


def _needed(block: BlockRecord) -> int:
    if block.kind == "skip":
        return 0
    if block.kind == "full":
        return len(block.queries) * len(block.keys)
    keys = block.keys
    return sum(max(0, min(q, keys[-1]) - keys.start + 1) for q in block.queries)


def _rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _post(outgoing: torch.Tensor, dst: int, incoming: torch.Tensor, src: int) -> list:
    """07's send_and_receive without the wait: post both, return the requests."""
    operations = []
    if outgoing.numel():
        operations.append(dist.P2POp(dist.isend, outgoing, dst))
    if incoming.numel():
        operations.append(dist.P2POp(dist.irecv, incoming, src))
    return dist.batch_isend_irecv(operations) if operations else []


def _pieces(
    x: torch.Tensor, chunks: list[range], dim: int = -2
) -> tuple[torch.Tensor, ...]:
    """Views of x's chunks along the sequence (dim -2; -1 for a log-sum-exp)."""
    return x.split([len(chunk) for chunk in chunks], dim=dim)


def attend_to_block(
    state: list,
    q: torch.Tensor,
    q_chunks: list[range],
    k: torch.Tensor,
    v: torch.Tensor,
    k_chunks: list[range],
    causal: bool,
    merge: Merge = merge_partials,
    block_kind: BlockKind = causal_block_kind,
) -> list[tuple[range, range, str]]:
    """Merge the attention of each query chunk over each key chunk into
    ``state[i]`` ((output, log-sum-exp) of query chunk i, or None); return the
    (queries, keys, kind) of every pair met, empty chunks left out (17)."""
    met = []
    for i, (queries, q_piece) in enumerate(zip(q_chunks, _pieces(q, q_chunks))):
        pairs = zip(k_chunks, _pieces(k, k_chunks), _pieces(v, k_chunks))
        for keys, k_piece, v_piece in pairs:
            if not len(queries) or not len(keys):
                continue
            kind = block_kind(queries, keys) if causal else "full"
            met.append((queries, keys, kind))
            if kind == "skip":
                continue
            partial = block_attention(q_piece, k_piece, v_piece, kind, queries, keys)
            state[i] = partial if state[i] is None else merge(*state[i], *partial)
    return met


def _finish(state: list, q: torch.Tensor, q_chunks: list[range]):
    """The running results of the query chunks joined: (output, log-sum-exp)."""
    outs, lses = [], []
    for result, piece in zip(state, _pieces(q, q_chunks)):
        if result is None:  # an empty chunk (or a block kind that skipped all)
            lse = piece.new_full(piece.shape[:-1], float("-inf"))
            result = (torch.zeros_like(piece), lse)
        outs.append(result[0])
        lses.append(result[1])
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def ring_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
    seq_len: int,
    causal: bool,
    record: RingRecord | None = None,
    merge: Merge = merge_partials,
    block_kind: BlockKind = causal_block_kind,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (output, log-sum-exp) of ring attention: q, k, v are its tokens
    (batch, heads, local tokens, head_dim) of a sequence of ``seq_len`` (17)."""
    rank, world_size = _rank_and_size()
    record = RingRecord(rank) if record is None else record
    chunks = [layout_chunks(layout, seq_len, world_size, r) for r in range(world_size)]
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    state: list = [None] * len(chunks[rank])
    kv = torch.stack([k, v])  # (2, b, h, tokens, d): one message per step
    for step in range(world_size):
        source = (rank - step) % world_size  # whose keys and values we hold
        if step < world_size - 1:  # the next block is on its way while we compute
            tokens = sum(len(c) for c in chunks[(source - 1) % world_size])
            incoming = kv.new_empty(kv.shape[:3] + (tokens, kv.shape[-1]))
            requests = _post(kv, right, incoming, left)
            record.forward_bytes += kv.numel() * kv.element_size()
        met = attend_to_block(
            state, q, chunks[rank], kv[0], kv[1], chunks[source], causal, merge,
            block_kind,
        )  # fmt: skip
        record.blocks += [BlockRecord(step, source, *pair) for pair in met]
        if step < world_size - 1:
            for request in requests:
                request.wait()
            kv = incoming
    return _finish(state, q, chunks[rank])


def simple_ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Ring attention without a mask, the loop of :func:`ring_attention_forward`
    alone: q, k, v (batch, heads, tokens, head_dim), the same number of contiguous
    tokens on every rank -> this rank's output (notebook 17)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    kv = torch.stack([k, v])  # keys and values travel together: one message
    out = lse = None
    for step in range(world_size):
        if step < world_size - 1:  # post the exchange first: it runs while we compute
            incoming = torch.empty_like(kv)
            requests = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, kv, right),
                    dist.P2POp(dist.irecv, incoming, left),
                ]
            )
        partial = block_attention(q, kv[0], kv[1])  # my queries, the block I hold
        out, lse = partial if out is None else merge_partials(out, lse, *partial)
        if step < world_size - 1:
            for request in requests:
                request.wait()
            kv = incoming  # the block of rank (rank - step - 1) mod world_size
    return out


def ring_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    layout: str,
    seq_len: int,
    causal: bool,
    record: RingRecord | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's (dq, dk, dv): the blocks go around again, each carrying the
    gradients of its keys and values, which come home one step after the last
    block's compute (17)."""
    rank, world_size = _rank_and_size()
    record = RingRecord(rank) if record is None else record
    chunks = [layout_chunks(layout, seq_len, world_size, r) for r in range(world_size)]
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    delta = (grad_out * out).sum(dim=-1)  # (b, h, tokens)
    grad_q = torch.zeros_like(q)
    # keys, values, and the gradients of the keys and the values, travelling together
    travelling = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
    for step in range(world_size):
        source = (rank - step) % world_size
        k_chunks = chunks[source]
        key_pieces = [_pieces(t, k_chunks) for t in travelling]  # views
        mine = chunks[rank]
        q_parts = zip(
            mine,
            _pieces(q, mine),
            _pieces(grad_q, mine),
            _pieces(grad_out, mine),
            _pieces(lse, mine, dim=-1),
            _pieces(delta, mine, dim=-1),
        )
        for queries, q_piece, dq_piece, do_piece, lse_piece, delta_piece in q_parts:
            for j, keys in enumerate(k_chunks):
                if not len(queries) or not len(keys):
                    continue
                kind = causal_block_kind(queries, keys) if causal else "full"
                if kind == "skip":
                    continue
                k_piece, v_piece, dk_piece, dv_piece = (p[j] for p in key_pieces)
                dq, dk, dv = block_attention_backward(
                    q_piece, k_piece, v_piece, kind, queries, keys, lse_piece,
                    do_piece, delta_piece,
                )  # fmt: skip
                dq_piece += dq
                dk_piece += dk
                dv_piece += dv
        if world_size == 1:
            break
        # on: the block with its gradients; last step: only the gradients, home
        outgoing = travelling if step < world_size - 1 else travelling[2:]
        tokens = sum(len(c) for c in chunks[(source - 1) % world_size])
        incoming = outgoing.new_empty(outgoing.shape[:3] + (tokens, q.shape[-1]))
        for request in _post(outgoing.contiguous(), right, incoming, left):
            request.wait()
        record.backward_bytes += outgoing.numel() * outgoing.element_size()
        travelling = incoming
    grad_k, grad_v = travelling[-2], travelling[-1]
    return grad_q, grad_k, grad_v


class RingAttention(torch.autograd.Function):
    """Ring attention with its ring backward, for autograd (17)."""

    @staticmethod
    def forward(ctx, q, k, v, layout, seq_len, causal, record):  # noqa: D102
        out, lse = ring_attention_forward(q, k, v, layout, seq_len, causal, record)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (layout, seq_len, causal, record)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        q, k, v, out, lse = ctx.saved_tensors
        grads = ring_attention_backward(
            q, k, v, out, lse, grad_out.contiguous(), *ctx.settings
        )
        return (*grads, None, None, None, None)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str,
    seq_len: int,
    causal: bool,
    record: RingRecord | None = None,
) -> torch.Tensor:
    """This rank's output of ring attention, differentiable: q, k, v (batch, heads,
    local tokens, head_dim) in ``layout`` of a sequence of ``seq_len`` (17)."""
    return RingAttention.apply(q, k, v, layout, seq_len, causal, record)


def simulate_ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    world_size: int,
    layout: str | Sequence[Sequence[range]],
    causal: bool,
    merge: Merge = merge_partials,
    block_kind: BlockKind = causal_block_kind,
) -> tuple[torch.Tensor, list[RingRecord]]:
    """Ring attention's forward played in one process, rank by rank: q, k, v
    (batch, heads, seq, head_dim) of the whole sequence, ``layout`` a name or each
    rank's chunks -> (the output in sequence order, each rank's record) (17)."""
    seq_len = q.shape[-2]
    if isinstance(layout, str):
        chunks = [
            layout_chunks(layout, seq_len, world_size, r) for r in range(world_size)
        ]
    else:
        chunks = [list(rank_chunks) for rank_chunks in layout]
    positions = [[p for chunk in c for p in chunk] for c in chunks]
    shards = [[t[..., p, :] for p in positions] for t in (q, k, v)]
    out = torch.zeros_like(q)
    records = []
    for rank in range(world_size):
        state: list = [None] * len(chunks[rank])
        record = RingRecord(rank)
        for step in range(world_size):
            source = (rank - step) % world_size
            met = attend_to_block(
                state, shards[0][rank], chunks[rank], shards[1][source],
                shards[2][source], chunks[source], causal, merge, block_kind,
            )  # fmt: skip
            record.blocks += [BlockRecord(step, source, *pair) for pair in met]
        local, _ = _finish(state, shards[0][rank], chunks[rank])
        out[..., positions[rank], :] = local
        records.append(record)
    return out, records
