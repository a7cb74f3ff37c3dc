"""One attention forward and backward on ranks, and its results put together (17).

An :class:`AttentionCase` is the whole problem (q, k, v and the gradient of the
output, for the whole sequence) and how to split it; every rank takes its tokens
(:func:`attention_step`), runs ring or Ulysses attention forward and backward,
and returns its pieces; :func:`merge_attention_results` puts the pieces back in
sequence order, to be compared with :func:`one_process_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from multigpu.context_parallel.attention import reference_attention
from multigpu.context_parallel.block import SavedBytes
from multigpu.context_parallel.layout import (
    check_layout,
    shard_sequence,
    unshard_sequence,
)
from multigpu.context_parallel.ring import RingRecord, ring_attention
from multigpu.context_parallel.ulysses import (
    UlyssesRecord,
    check_ulysses,
    ulysses_attention,
)
from multigpu.core.checks import check_choice

__all__ = [
    "SCHEMES",
    "AttentionCase",
    "AttentionRun",
    "attention_step",
    "make_attention_case",
    "merge_attention_results",
    "one_process_attention",
]

SCHEMES = ("ring", "ulysses")


@dataclass(frozen=True)
class AttentionCase:
    """q, k, v and grad_out (batch, heads, seq, head_dim) of the whole sequence,
    split by ``scheme`` ("ring" or "ulysses") in ``layout``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    causal: bool
    layout: str = "contiguous"
    scheme: str = "ring"

    def check(self, world_size: int) -> None:
        """Raise ``ValueError`` if the scheme cannot split this case (17)."""
        check_choice("scheme", self.scheme, SCHEMES)
        check_layout(self.layout, self.q.shape[2], world_size)
        if self.scheme == "ulysses":
            check_choice("Ulysses layout", self.layout, ("contiguous",))
            check_ulysses(self.q.shape[1], world_size)


def make_attention_case(
    seq_len: int,
    causal: bool,
    layout: str = "contiguous",
    scheme: str = "ring",
    heads: int = 2,
    head_dim: int = 4,
    batch: int = 1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> AttentionCase:
    """A case of random q, k, v and grad_out from ``seed`` (17)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v, grad_out = (
        torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
        for _ in range(4)
    )
    return AttentionCase(q, k, v, grad_out, causal, layout, scheme)


@dataclass
class AttentionRun:
    """The ranks' results in sequence order: the output and the gradients of q, k
    and v (batch, heads, seq, head_dim), and each rank's record."""

    out: torch.Tensor
    grad_q: torch.Tensor
    grad_k: torch.Tensor
    grad_v: torch.Tensor
    records: list = field(default_factory=list)  # RingRecord or UlyssesRecord
    saved_bytes: list = field(default_factory=list)  # per rank, kept for backward


def one_process_attention(case: AttentionCase) -> dict[str, torch.Tensor]:
    """The reference: {"out", "grad_q", "grad_k", "grad_v"} of one process (17)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v))
    out = reference_attention(q, k, v, case.causal)
    out.backward(case.grad_out)
    return {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


def attention_step(case: AttentionCase) -> dict:
    """This rank's (in a process group) forward and backward of ``case`` on its
    tokens: its pieces of
    {"out", "grad_q", "grad_k", "grad_v"}, its "record" and the "saved_bytes" of
    its forward (17)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    case.check(world_size)
    seq_len = case.q.shape[2]
    q, k, v, grad_out = (
        shard_sequence(t, case.layout, world_size, rank)
        for t in (case.q, case.k, case.v, case.grad_out)
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with SavedBytes() as saved:  # what autograd keeps from forward to backward
        if case.scheme == "ring":
            record = RingRecord(rank)
            out = ring_attention(q, k, v, case.layout, seq_len, case.causal, record)
        else:
            record = UlyssesRecord()
            out = ulysses_attention(q, k, v, seq_len, case.causal, record)
    out.backward(grad_out)
    return {
        "out": out.detach(),
        "grad_q": q.grad,
        "grad_k": k.grad,
        "grad_v": v.grad,
        "record": record,
        "saved_bytes": saved.total,
    }


def merge_attention_results(case: AttentionCase, per_rank: list[dict]) -> AttentionRun:
    """Every rank's pieces (rank order) in sequence order (17)."""
    seq_len = case.q.shape[2]
    joined = {
        key: unshard_sequence([r[key] for r in per_rank], case.layout, seq_len)
        for key in ("out", "grad_q", "grad_k", "grad_v")
    }
    return AttentionRun(
        **joined,
        records=[r["record"] for r in per_rank],
        saved_bytes=[r["saved_bytes"] for r in per_rank],
    )
