"""Attention in one process, and attention over one block of keys (17).

Shapes: q, k, v are (batch, heads, tokens, head_dim); a log-sum-exp ``lse`` is
(batch, heads, tokens). For the queries of a block and a *block* of keys,
:func:`block_attention` returns the block's output, normalised by the block's own
softmax sum, and that sum's logarithm, the log-sum-exp of the scores. Two such
partial results over two disjoint key blocks merge exactly into the result over
both (:func:`merge_partials`), which is what lets ring attention see the keys one
block at a time.

Under a causal mask a query at position i sees the keys at positions j <= i. A
block of queries against a block of keys (each a run of positions) is then either
entirely visible, partly visible (the block on the diagonal: a mask is needed) or
entirely in the future (skipped): :func:`causal_block_kind`.

:func:`block_attention_backward` is the gradient of one block, computed from the
*final* output and log-sum-exp (FlashAttention's backward, Dao et al. 2022,
arXiv:2205.14135, Algorithm 4), so that a ring can add up the gradients block by
block.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "BLOCK_KINDS",
    "block_attention",
    "block_attention_backward",
    "causal_block_kind",
    "merge_partials",
    "reference_attention",
]

BLOCK_KINDS = ("skip", "full", "causal")


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, h, sq, sk)


def _visible(queries: range, keys: range) -> torch.Tensor:
    """(len(queries), len(keys)) booleans: key position <= query position."""
    q_positions = torch.arange(queries.start, queries.stop)
    k_positions = torch.arange(keys.start, keys.stop)
    return k_positions[None, :] <= q_positions[:, None]


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    """Softmax attention in one process, the reference every split is compared
    with: q, k, v (batch, heads, seq, head_dim) -> (batch, heads, seq, head_dim)
    (17)."""
    scores = _scores(q, k)
    if causal:
        seq = q.shape[-2]
        scores = scores.masked_fill(~_visible(range(seq), range(seq)), float("-inf"))
    return scores.softmax(dim=-1) @ v


def causal_block_kind(queries: range, keys: range) -> str:
    """How a block of queries at positions ``queries`` attends to a block of keys
    at positions ``keys`` under a causal mask: "skip" (every key is in every
    query's future), "full" (every key is visible to every query) or "causal"
    (the diagonal: a mask is needed) (17)."""
    if keys.start > queries[-1]:
        return "skip"
    if keys[-1] <= queries.start:
        return "full"
    return "causal"


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str = "full",
    queries: range | None = None,
    keys: range | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over one block of keys: (output normalised by the block's
    softmax sum (b, h, sq, d), log-sum-exp of the block's scores (b, h, sq)).
    ``kind`` "causal" masks the keys after each query, by the positions
    ``queries`` and ``keys``; a row that sees no key gets output 0 and
    log-sum-exp -inf (17)."""
    scores = _scores(q, k)
    if kind == "causal":
        scores = scores.masked_fill(~_visible(queries, keys), float("-inf"))
    lse = scores.logsumexp(dim=-1)  # (b, h, sq)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probabilities = torch.exp(scores - finite[..., None])  # 0 where masked
    return probabilities @ v, lse


def merge_partials(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results of the same queries over two disjoint
    blocks of keys into the result over both: outputs (b, h, sq, d), log-sum-exps
    (b, h, sq) -> (output, log-sum-exp) (17)."""
    lse = torch.maximum(lse_a, lse_b)
    lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # both empty
    weight_a, weight_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    total = weight_a + weight_b
    out = (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / torch.where(
        total > 0, total, torch.ones_like(total)
    )[..., None]
    return out, lse + torch.log(total)


def block_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kind: str,
    queries: range | None,
    keys: range | None,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of the gradients (dq, dk, dv), from the final
    log-sum-exp ``lse`` of the queries and ``delta`` = rowsum(grad_out * out)
    (b, h, sq); the ring adds the shares of all blocks (17)."""
    scores = _scores(q, k)
    if kind == "causal":
        scores = scores.masked_fill(~_visible(queries, keys), float("-inf"))
    probabilities = torch.exp(scores - lse[..., None])  # the final softmax's block
    grad_v = probabilities.transpose(-2, -1) @ grad_out
    grad_probabilities = grad_out @ v.transpose(-2, -1)
    grad_scores = probabilities * (grad_probabilities - delta[..., None])
    scale = 1 / math.sqrt(q.shape[-1])
    grad_q = grad_scores @ k * scale
    grad_k = grad_scores.transpose(-2, -1) @ q * scale
    return grad_q, grad_k, grad_v
