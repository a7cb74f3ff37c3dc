"""Llama-3-shaped models with no memory: built on the meta device, run under
``FakeTensorMode`` (20).

:class:`LlamaShape` holds a shape (:data:`LLAMA3_8B` is 14b's
:data:`~multigpu.costmodel.fsdp2.LLAMA3_8B`; :data:`LLAMA3_70B` from the same
paper's Table 3 and the model's config.json: 80 layers, dimension 8192, FFN
28672, 64 heads, 8 key/value heads). :class:`Llama` is the architecture as a
plain ``nn.Module``: token embedding, blocks of RMSNorm, grouped-query attention
and a SwiGLU MLP, a final RMSNorm and an untied output layer. :func:`llama_tp_plan`
is torchtitan's tensor-parallel plan for it (q, k, v, gate and up column-wise;
o and down row-wise; the embedding row-wise and the output column-wise).
Rotary embeddings are left out: they hold no parameters and move no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.costmodel.fsdp2 import LLAMA3_8B as _LLAMA3_8B_SHAPE


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-shaped model: layers, model dimension, FFN width, attention heads,
    key/value heads and vocabulary (20)."""

    name: str
    layers: int
    dim: int
    ffn_dim: int
    heads: int
    kv_heads: int
    vocab: int

    def as_dict(self) -> dict[str, int]:
        """The shape as 14b's dict (for :func:`llama_parameter_counts`)."""
        keys = ("layers", "dim", "ffn_dim", "heads", "kv_heads", "vocab")
        return {key: getattr(self, key) for key in keys}


LLAMA3_8B = LlamaShape("Llama-3-8B", **_LLAMA3_8B_SHAPE)
LLAMA3_70B = LlamaShape("Llama-3-70B", 80, 8192, 28672, 64, 8, 128256)


class Attention(nn.Module):
    """Grouped-query causal attention: ``heads`` query heads share ``kv_heads``
    key/value heads; under tensor parallelism each rank holds 1/tp of both (20)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        head_dim = shape.dim // shape.heads
        self.head_dim = head_dim
        self.wq = nn.Linear(shape.dim, shape.heads * head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(shape.heads * head_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape  # (batch, seq, dim)
        q = self.wq(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (20)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(shape.ffn_dim, shape.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then + MLP(norm(x)) (20)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.dim)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab): embedding, ``layers``
    blocks, final RMSNorm, untied output layer (20)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        if shape.dim % shape.heads or shape.heads % shape.kv_heads:
            raise ValueError(
                f"{shape.name}: dim {shape.dim} must be a multiple of heads "
                f"{shape.heads}, and heads of kv_heads {shape.kv_heads}. Fix the shape."
            )
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.dim)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.RMSNorm(shape.dim)
        self.output = nn.Linear(shape.dim, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def llama_tp_plan() -> tuple[dict, dict]:
    """torchtitan's tensor-parallel plan for :class:`Llama`, without sequence
    parallelism: (the plan of the root, the plan of each block) (20)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    root = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    block = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    return root, block


def parallelize_llama(model: Llama, mesh, mixed_precision: bool = True) -> Llama:
    """Tensor parallel over ``mesh["tp"]`` (when its size is over 1), then FSDP2
    over ``mesh["dp"]`` per block and at the root, bf16 compute and fp32
    reduce-scatters when ``mixed_precision`` (20)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if mesh["tp"].size() > 1:
        root_plan, block_plan = llama_tp_plan()
        parallelize_module(model, mesh["tp"], root_plan)
        for block in model.layers:
            parallelize_module(block, mesh["tp"], block_plan)
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if mixed_precision else None,
        reduce_dtype=torch.float32 if mixed_precision else None,
    )
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)
    return model
