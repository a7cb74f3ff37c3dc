"""A self-attention block under context parallelism, and its training step (17).

The block, (batch, tokens, hidden) -> same shape, projects its tokens to q, k, v,
attends with whichever attention it is given, and projects back. Under context
parallelism every rank holds the *whole* block (all weights) and its own tokens:
the projections are per token and need nothing from other ranks; only attention
does (ring or Ulysses). Each rank's weight gradients then come from its tokens
only, so they are summed over the ranks (an all-reduce, 07's ring), as data
parallelism does over samples. Ranks that start from different random weights
take rank 0's first (:func:`broadcast_parameters`); a frozen projection gets no
gradient and is left out of the all-reduce.

:func:`cp_block_step` is one rank's step (forward, loss over its tokens, backward,
all-reduce), :func:`one_process_block_step` the reference; :class:`SavedBytes`
counts what autograd keeps for backward in a forward (17's memory section).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from multigpu.collectives import ring_all_reduce
from multigpu.context_parallel.attention import reference_attention
from multigpu.context_parallel.layout import shard_sequence
from multigpu.context_parallel.ring import RingRecord, ring_attention
from multigpu.context_parallel.ulysses import UlyssesRecord, ulysses_attention

__all__ = [
    "AttentionBlock",
    "SavedBytes",
    "broadcast_parameters",
    "cp_block_step",
    "make_attention_block",
    "one_process_block_step",
]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class AttentionBlock(nn.Module):
    """Multi-head self-attention, (batch, tokens, hidden) -> same shape; the
    attention itself is an argument of forward (17)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:  # noqa: D102
        b, tokens, hidden = x.shape  # tokens may be 0: a rank with no tokens
        q, k, v = (
            proj(x).view(b, tokens, self.heads, hidden // self.heads).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )  # each (b, heads, tokens, head_dim)
        context = attend(q, k, v).transpose(1, 2).reshape(b, tokens, hidden)
        return self.out(context)


def make_attention_block(
    hidden: int = 8,
    heads: int = 2,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    frozen: Sequence[str] = (),
) -> AttentionBlock:
    """A fresh block from ``seed``, with the parameters named in ``frozen``
    (e.g. "k.weight") set to requires_grad=False (17)."""
    torch.manual_seed(seed)
    block = AttentionBlock(hidden, heads).to(dtype)
    for name, parameter in block.named_parameters():
        parameter.requires_grad_(name not in frozen)
    return block


def broadcast_parameters(block: nn.Module) -> None:
    """Every rank takes rank 0's parameters (17)."""
    with torch.no_grad():
        for parameter in block.parameters():
            dist.broadcast(parameter, src=0)


def _loss(output: torch.Tensor, target: torch.Tensor, num_tokens: int):
    """Summed squared error over these tokens, divided by all tokens of the batch:
    the ranks' losses add up to one process's mean."""
    return ((output - target) ** 2).sum() / num_tokens


def one_process_block_step(
    block: AttentionBlock, x: torch.Tensor, target: torch.Tensor, causal: bool
) -> tuple[float, dict[str, torch.Tensor | None]]:
    """One process, whole sequence: (loss, {name: gradient or None}) (17)."""
    block.zero_grad(set_to_none=True)

    def attend(q, k, v):
        return reference_attention(q, k, v, causal)

    loss = _loss(block(x, attend), target, x.shape[0] * x.shape[1])
    loss.backward()
    return loss.item(), {
        n: None if p.grad is None else p.grad.clone()
        for n, p in block.named_parameters()
    }


def cp_block_step(
    block: AttentionBlock,
    x: torch.Tensor,
    target: torch.Tensor,
    causal: bool,
    scheme: str = "ring",
    layout: str = "contiguous",
) -> dict:
    """One step of this rank (in a process group) on its tokens of x and target
    (batch, seq, hidden); ``scheme`` "ring" or "ulysses" (contiguous only):
    {"loss": the summed loss, "gradients": all-reduced, "saved_bytes": of the
    forward} (17)."""
    if not isinstance(block, AttentionBlock):
        raise TypeError(
            f"cp_block_step splits the sequence of an AttentionBlock (q, k, v and out "
            f"around attention); got {type(block).__name__}, which has no attention "
            "to split. Build the block with make_attention_block."
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    seq_len = x.shape[1]
    x_local, target_local = (
        shard_sequence(t, layout, world_size, rank, dim=1) for t in (x, target)
    )
    if scheme == "ring":

        def attend(q, k, v):
            return ring_attention(q, k, v, layout, seq_len, causal, RingRecord(rank))

    else:

        def attend(q, k, v):
            return ulysses_attention(q, k, v, seq_len, causal, UlyssesRecord())

    block.zero_grad(set_to_none=True)
    with SavedBytes(block) as counter:
        output = block(x_local, attend)
    loss = _loss(output, target_local, x.shape[0] * seq_len)
    loss.backward()
    for parameter in block.parameters():
        if parameter.grad is not None:  # frozen: None on every rank
            ring_all_reduce(parameter.grad)
    total = loss.detach().clone()
    ring_all_reduce(total)
    gradients = {
        n: None if p.grad is None else p.grad.clone()
        for n, p in block.named_parameters()
    }
    return {"loss": total.item(), "gradients": gradients, "saved_bytes": counter.total}


class SavedBytes:
    """``with SavedBytes(module) as counter:``: counter.total is the bytes autograd
    saves for backward inside, each tensor once, the module's parameters and
    buffers excluded (17)."""

    def __init__(self, module: nn.Module | None = None) -> None:
        self.skip = set()
        if module is not None:
            self.skip = {
                t.data_ptr() for t in (*module.parameters(), *module.buffers())
            }
        self.seen: set[tuple[int, int]] = set()
        self.total = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if tensor.data_ptr() not in self.skip and key not in self.seen:
            self.seen.add(key)
            self.total += key[1]
        return tensor

    def __enter__(self) -> SavedBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
