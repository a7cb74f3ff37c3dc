"""The one-process transformer block that tensor parallelism splits (15).

A pre-LayerNorm block, ``x + dropout(attention(ln1(x)))`` then
``x + dropout(mlp(ln2(x)))``, small enough to check every number, and a tiny
language model around it (embedding, block, head). Dropout takes its mask from
:func:`dropout_mask`, a function of the full shape and a seed, so that ranks that
hold a slice of the sequence can take the same slice of the same mask.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def dropout_mask(
    shape: tuple[int, ...], p: float, seed: int, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The scaled keep-mask of inverted dropout for a tensor of ``shape``: 0 where
    dropped, 1/(1-p) where kept; the same on every rank for the same seed (15)."""
    generator = torch.Generator().manual_seed(seed)
    keep = torch.rand(shape, generator=generator) >= p
    return keep.to(dtype) / (1 - p)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention per head: q, k, v (batch, heads, seq, head_dim)."""
    seq = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, heads, s, s)
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    probabilities = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return probabilities @ v  # (b, heads, s, head_dim)


class Attention(nn.Module):
    """Multi-head causal self-attention: (batch, seq, hidden) -> same shape."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            proj(x).view(b, s, self.heads, -1).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        context = causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        return self.out(context)


class MLP(nn.Module):
    """hidden -> ffn -> GELU -> hidden."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-LayerNorm transformer block: (batch, seq, hidden) -> same shape."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln1(x)), seed)
        return x + self._drop(self.mlp(self.ln2(x)), seed + 1)

    def _drop(self, x: torch.Tensor, seed: int) -> torch.Tensor:
        if not self.dropout:
            return x
        return x * dropout_mask(x.shape, self.dropout, seed, x.dtype)


class TinyLM(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab): embedding, one block,
    LayerNorm, head."""

    def __init__(self, vocab: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.block = Block(hidden, heads, ffn)
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.block(self.embed(tokens))))


def make_block(
    hidden: int = 8,
    heads: int = 4,
    ffn: int = 16,
    dropout: float = 0.0,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> Block:
    """A :class:`Block` from ``seed`` with LayerNorm weights that are not 1 and 0,
    so that a wrong gradient of them shows (15)."""
    torch.manual_seed(seed)
    block = Block(hidden, heads, ffn, dropout).to(dtype)
    with torch.no_grad():
        for norm in (block.ln1, block.ln2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return block
