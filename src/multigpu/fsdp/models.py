"""The notebook's model with every case a sharded wrapper can get wrong (14).

:class:`TiedFrozenNet` has a weight tied between two layers, a frozen layer, a
layer never called in forward and a buffer read in forward, and a parameter count
that no world size from 2 to 4 divides: the hard cases of the tests
(``tests/hard_cases.py``), as a model a notebook can hand to its ranks.
"""

from __future__ import annotations

import torch
from torch import nn


class TiedFrozenNet(nn.Module):
    """(N, inputs) -> logits (N, classes) through embed, frozen, encode, decode
    (encode's weight, tied), head; ``unused`` is never called (14)."""

    def __init__(self, inputs: int = 6, hidden: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(inputs, hidden)
        self.frozen = nn.Linear(hidden, hidden).requires_grad_(False)
        self.encode = nn.Linear(hidden, hidden, bias=False)
        self.decode = nn.Linear(hidden, hidden, bias=False)
        self.decode.weight = self.encode.weight  # one tensor, two modules: tied
        self.head = nn.Linear(hidden, classes)
        self.unused = nn.Linear(hidden, 2)  # never called in forward
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        h = torch.tanh(self.frozen(h))
        h = torch.tanh(self.decode(torch.tanh(self.encode(h))))
        return self.head(h * self.scale)
