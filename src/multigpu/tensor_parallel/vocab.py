"""Vocabulary-parallel embedding and cross-entropy: the logits are never gathered
(15).

With a vocabulary of V tokens over n ranks, rank r holds tokens
[r·V/n, (r+1)·V/n): its rows of the embedding table and of the output head.

- :class:`VocabParallelEmbedding`: each rank looks up the tokens it holds, writes
  zeros for the others, and g (:class:`ReduceFromTensorParallel`) sums the ranks.
- :func:`vocab_parallel_cross_entropy`: from this rank's logits (N, V/n), the loss
  log Σ exp(z) − z_target of the full softmax, with three collectives of N values
  instead of gathering N·V: the maximum (for stability), the sum of exponentials,
  and the target's logit (held by one rank). The gradient, softmax − one-hot, is
  local. Megatron's version: ``megatron/core/tensor_parallel/cross_entropy.py``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.tensor_parallel.blocks import TensorParallelBlock, shard_block_state
from multigpu.tensor_parallel.layers import (
    ColumnParallelLinear,
    check_splittable,
    column_shard,
)
from multigpu.tensor_parallel.operators import (
    ReduceFromTensorParallel,
    all_reduce_max,
    all_reduce_sum,
    check_divisible,
)


class VocabParallelEmbedding(nn.Module):
    """tokens (...) -> embeddings (..., hidden), with this rank's V/n rows (15)."""

    def __init__(self, embedding: nn.Embedding, rank: int, world_size: int) -> None:
        super().__init__()
        vocab = embedding.num_embeddings
        check_divisible("vocab", vocab, world_size)
        self.start = rank * vocab // world_size
        self.end = (rank + 1) * vocab // world_size
        self.weight = nn.Parameter(
            column_shard(embedding.weight.detach(), rank, world_size)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        rows = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return ReduceFromTensorParallel.apply(rows)  # each token from one rank


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from this rank's logits (15): see
    :func:`vocab_parallel_cross_entropy`."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, start: int):
        # logits (N, V/n) for tokens [start, start + V/n); target (N,) in [0, V).
        peak = all_reduce_max(logits.max(dim=-1).values)  # (N,): the global max
        shifted = logits - peak.unsqueeze(-1)  # every exponent <= 0: no overflow
        exp = shifted.exp()
        sum_exp = all_reduce_sum(exp.sum(dim=-1), "forward")  # (N,): over all V
        local = target - start
        mine = (local >= 0) & (local < logits.shape[-1])
        local = local.masked_fill(~mine, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        target_logit = all_reduce_sum(picked, "forward")  # one rank holds it
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local, mine)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, local, mine = ctx.saved_tensors
        grad_logits = softmax.clone()  # d loss / d z = softmax - one_hot(target)
        rows = torch.arange(len(local))
        grad_logits[rows, local] -= mine.to(softmax.dtype)
        return grad_logits * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, start: int
) -> torch.Tensor:
    """Mean cross-entropy over the tokens, equal to ``F.cross_entropy`` of the full
    logits, from this rank's (..., V/n) logits of tokens [start, start + V/n) (15)."""
    flat = logits.reshape(-1, logits.shape[-1])
    return vocab_parallel_token_losses(flat, target.reshape(-1), start).mean()


def vocab_parallel_token_losses(
    logits: torch.Tensor, target: torch.Tensor, start: int
) -> torch.Tensor:
    """One loss per token (N,) from this rank's logits (N, V/n) (15)."""
    return VocabParallelCrossEntropy.apply(logits, target, start)


def vocab_start(vocab: int, rank: int, world_size: int) -> int:
    """The first token rank ``rank`` holds of a vocabulary of ``vocab`` (15)."""
    check_divisible("vocab", vocab, world_size)
    return rank * vocab // world_size


class TensorParallelLM(nn.Module):
    """This rank's part of a :class:`~multigpu.tensor_parallel.model.TinyLM`:
    vocabulary-parallel embedding, tensor-parallel block, replicated LayerNorm, and
    a column-parallel head whose logits stay split by vocabulary (15)."""

    def __init__(self, lm: nn.Module, rank: int, world_size: int) -> None:
        super().__init__()
        check_splittable(lm, "The language model")
        self.embed = VocabParallelEmbedding(lm.embed, rank, world_size)
        self.block = TensorParallelBlock(lm.block, rank, world_size)
        self.ln = copy.deepcopy(lm.ln)
        self.head = ColumnParallelLinear.from_linears([lm.head], rank, world_size)
        self.start = self.embed.start

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b, s) -> this rank's logits (b, s, V/n)."""
        return self.head(self.ln(self.block(self.embed(tokens))))

    def loss(self, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self(tokens), target, self.start)


def shard_lm_state(
    state: dict[str, torch.Tensor], rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """A one-process TinyLM's state (or gradients) cut into rank ``rank``'s
    :class:`TensorParallelLM` state (15)."""
    block = {k[len("block.") :]: v for k, v in state.items() if k.startswith("block.")}
    shard = {
        f"block.{k}": v for k, v in shard_block_state(block, rank, world_size).items()
    }
    for name in ("embed.weight", "head.weight"):
        shard[name] = column_shard(state[name], rank, world_size)
    shard |= {k: v.clone() for k, v in state.items() if k.startswith("ln.")}
    return shard
