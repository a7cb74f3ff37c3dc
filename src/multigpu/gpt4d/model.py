"""The lesson's model: a tiny GPT, and its one-process training step (19).

:class:`TinyGPT` is token and position embeddings, ``layers`` pre-LayerNorm
blocks of causal attention and MLP (the :class:`~multigpu.tensor_parallel.model.Block`
of 15, dropout off), a final LayerNorm, and a head tied to the token embedding:
the logits are ``x @ embed.weight.T``, so the embedding's gradient has two
sources, the input side and the head. The loss is a sum over the batch's tokens
divided by a count given by the caller, so that ranks holding uneven parts of a
batch add up to the one-process mean.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.gpt4d.config import GPTConfig
from multigpu.tensor_parallel.model import Block

__all__ = [
    "GPTConfig",
    "TinyGPT",
    "count_parameters",
    "make_gpt",
    "make_token_batches",
    "one_process_training",
    "token_loss_sum",
]


class TinyGPT(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab); the head is the token
    embedding's weight (tied), so it has no parameter of its own (19)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.dim % config.heads:
            raise ValueError(
                f"dim {config.dim} is not divisible by heads {config.heads}; "
                "choose a dim that is a multiple of heads."
            )
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.dim)
        self.pos = nn.Embedding(config.seq_len, config.dim)
        self.blocks = nn.ModuleList(
            Block(config.dim, config.heads, config.ffn) for _ in range(config.layers)
        )
        self.ln_f = nn.LayerNorm(config.dim)

    def embed_tokens(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token plus position embeddings of ``tokens`` whose first position is
        ``start`` (a rank that holds a slice of the sequence passes its offset)."""
        positions = torch.arange(start, start + tokens.shape[-1])
        return self.embed(tokens) + self.pos(positions)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm, then the tied head: logits over the vocabulary."""
        return self.ln_f(x) @ self.embed.weight.T

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def count_parameters(config: GPTConfig) -> int:
    """The number of parameters of ``TinyGPT(config)``, counted from its shape:
    the tied head adds none (19)."""
    d, f = config.dim, config.ffn
    attention = 4 * (d * d + d)
    mlp = d * f + f + f * d + d
    norms = 2 * 2 * d
    return (
        config.vocab * d
        + config.seq_len * d
        + config.layers * (attention + mlp + norms)
        + 2 * d
    )


def make_gpt(
    config: GPTConfig, dtype: torch.dtype = torch.float64, seed: int = 0
) -> TinyGPT:
    """A :class:`TinyGPT` from ``seed``, LayerNorm weights not 1 and 0, so that a
    wrong gradient of them shows (19)."""
    torch.manual_seed(seed)
    model = TinyGPT(config).to(dtype)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def make_token_batches(
    config: GPTConfig, sizes: tuple[int, ...] = (5, 3, 7), seed: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (inputs, targets) pair per step, of ``sizes[i]`` sequences each
    (uneven on purpose): targets are the inputs shifted by one token (19)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for size in sizes:
        shape = (size, config.seq_len + 1)
        tokens = torch.randint(0, config.vocab, shape, generator=generator)
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of logits (batch, seq, vocab) against targets (batch,
    seq), summed over tokens: divide by the global count (19)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
    )


def one_process_training(
    config: GPTConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    dtype: torch.dtype = torch.float64,
    lr: float = 0.1,
    seed: int = 0,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: SGD on one process, mean token loss per step. Returns the
    final state and the losses (19)."""
    model = make_gpt(config, dtype, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = token_loss_sum(model(inputs), targets) / targets.numel()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
