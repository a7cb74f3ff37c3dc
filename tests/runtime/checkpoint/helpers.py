"""Models shared by the tests of multigpu.runtime.checkpoint."""

import torch
from torch import nn

from multigpu.runtime.checkpoint import unwrap


def small_model(seed: int = 0) -> nn.Module:
    """A model with parameters and buffers (BatchNorm), so metadata matters too."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = unwrap(a).state_dict(), unwrap(b).state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0)


class Opaque:
    """An arbitrary class: weights-only loading refuses to unpickle it."""
