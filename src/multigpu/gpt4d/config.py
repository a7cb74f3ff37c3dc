"""The shape of the tiny GPT, without importing torch (19).

:class:`GPTConfig` lives here so that the torchrun script can check a grid against
the model (heads, layers, sequence) and refuse it before it imports torch;
:mod:`multigpu.gpt4d.model` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a :class:`~multigpu.gpt4d.model.TinyGPT` (19)."""

    vocab: int = 16  # tokens in the vocabulary
    seq_len: int = 8  # tokens per sequence (the positions the model knows)
    dim: int = 8  # the residual stream's width
    heads: int = 2  # attention heads, dim/heads features each
    layers: int = 2  # transformer blocks
    mlp_ratio: int = 2  # the MLP's hidden width is mlp_ratio * dim

    @property
    def ffn(self) -> int:
        """The MLP's hidden width."""
        return self.mlp_ratio * self.dim
