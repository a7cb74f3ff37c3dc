"""Ulysses: all-to-all from a split sequence to split heads, and back (17).

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509). Each rank holds its
tokens of q, k and v for *all* heads, (batch, heads, local tokens, head_dim). One
all-to-all per tensor gives every rank *all* tokens for heads/n of the heads,
(batch, heads/n, seq, head_dim): rank j sends rank i its tokens of head group i.
Attention is then ordinary attention, whole sequence, causal or not, for those
heads; a last all-to-all brings the output back to the split sequence. The
all-to-all is an autograd Function whose backward is the reverse all-to-all, so
autograd gives the gradients.

It needs the heads divisible by the world size (each rank takes whole heads) and
refuses anything else by name; the sequence may split unevenly (contiguous
layout, the split sizes of ``all_to_all_single`` differ per rank). Bytes are
counted to other ranks only (the piece a rank keeps moves nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from multigpu.context_parallel.attention import reference_attention
from multigpu.context_parallel.layout import layout_chunks

__all__ = [
    "UlyssesRecord",
    "check_ulysses",
    "heads_to_sequence",
    "sequence_to_heads",
    "ulysses_attention",
]


@dataclass
class UlyssesRecord:
    """Bytes this rank sent to other ranks in Ulysses' all-to-alls."""

    forward_bytes: int = 0
    backward_bytes: int = 0


def check_ulysses(heads: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``heads`` splits over ``world_size`` ranks (17)."""
    if heads % world_size:
        divisors = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ValueError(
            f"Ulysses needs the number of heads ({heads}) to be divisible by the "
            f"world size ({world_size}): each rank attends with whole heads. Use a "
            f"world size in {divisors}, or ring attention, which splits the sequence "
            "only."
        )


def _token_counts(seq_len: int, world_size: int) -> list[int]:
    return [
        len(layout_chunks("contiguous", seq_len, world_size, r)[0])
        for r in range(world_size)
    ]


def _all_to_all(pieces: list[torch.Tensor], shapes: list[tuple]) -> tuple:
    """Send pieces[j] to rank j; return what each rank sent us (shapes[i]) and the
    bytes sent to other ranks."""
    rank = dist.get_rank()
    send = torch.cat([p.reshape(-1) for p in pieces])
    sizes = [int(torch.Size(shape).numel()) for shape in shapes]
    received = send.new_empty(sum(sizes))
    dist.all_to_all_single(
        received, send, sizes, [p.numel() for p in pieces]
    )  # fmt: skip
    sent = sum(p.numel() for j, p in enumerate(pieces) if j != rank)
    out = [c.view(shape) for c, shape in zip(received.split(sizes), shapes)]
    return out, sent * send.element_size()


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seq_len, record):  # noqa: D102
        ctx.settings = (seq_len, record)
        return _sequence_to_heads(x, seq_len, record, "forward_bytes")

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        seq_len, record = ctx.settings
        return _heads_to_sequence(grad, seq_len, record, "backward_bytes"), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seq_len, record):  # noqa: D102
        ctx.settings = (seq_len, record)
        return _heads_to_sequence(x, seq_len, record, "forward_bytes")

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        seq_len, record = ctx.settings
        return _sequence_to_heads(grad, seq_len, record, "backward_bytes"), None, None


def _sequence_to_heads(x, seq_len, record, counter):
    world_size = dist.get_world_size()
    b, heads, _, d = x.shape
    check_ulysses(heads, world_size)
    group = heads // world_size
    pieces = list(x.split(group, dim=1))  # head group j goes to rank j
    shapes = [(b, group, t, d) for t in _token_counts(seq_len, world_size)]
    received, sent = _all_to_all(pieces, shapes)
    setattr(record, counter, getattr(record, counter) + sent)
    return torch.cat(received, dim=2)  # every rank's tokens, in sequence order


def _heads_to_sequence(x, seq_len, record, counter):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    b, group, _, d = x.shape
    counts = _token_counts(seq_len, world_size)
    pieces = list(x.split(counts, dim=2))  # rank j's tokens go back to rank j
    shapes = [(b, group, counts[rank], d)] * world_size
    received, sent = _all_to_all(pieces, shapes)
    setattr(record, counter, getattr(record, counter) + sent)
    return torch.cat(received, dim=1)  # all head groups, in rank order


def sequence_to_heads(
    x: torch.Tensor, seq_len: int, record: UlyssesRecord | None = None
) -> torch.Tensor:
    """(batch, heads, local tokens, d) -> (batch, heads/n, seq_len, d): this rank's
    head group over the whole sequence; differentiable (17)."""
    return _SequenceToHeads.apply(x, seq_len, record or UlyssesRecord())


def heads_to_sequence(
    x: torch.Tensor, seq_len: int, record: UlyssesRecord | None = None
) -> torch.Tensor:
    """(batch, heads/n, seq_len, d) -> (batch, heads, local tokens, d): the
    inverse of :func:`sequence_to_heads`; differentiable (17)."""
    return _HeadsToSequence.apply(x, seq_len, record or UlyssesRecord())


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_len: int,
    causal: bool,
    record: UlyssesRecord | None = None,
) -> torch.Tensor:
    """This rank's output of Ulysses attention: q, k, v (batch, heads, local
    tokens, head_dim), its contiguous tokens of ``seq_len`` (17)."""
    check_ulysses(q.shape[1], dist.get_world_size())
    record = UlyssesRecord() if record is None else record
    q_h, k_h, v_h = (sequence_to_heads(t, seq_len, record) for t in (q, k, v))
    out = reference_attention(q_h, k_h, v_h, causal)  # whole sequence, some heads
    return heads_to_sequence(out, seq_len, record)
