"""The hard cases every "equal to one process" test runs on: a model with a weight
tied between two modules, a frozen parameter, a parameter unused in forward and a
buffer, whose parameter count no world size from 2 to 4 divides; a model with fewer
parameters than ranks; data that no global batch of 2-4 ranks divides; float32 and
float64. Ranks may build the model from their own seed (``seed + rank``): a wrapper
must then make them agree, or refuse."""

import torch
from torch import nn

IN_FEATURES = 6
CLASSES = 3
NUM_SAMPLES = 41  # prime: no global batch of 2-4 ranks divides it
DTYPES = (torch.float32, torch.float64)


class HardCaseNet(nn.Module):
    """in (N, 6) -> logits (N, 3), through every case a wrapper can get wrong."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, hidden)
        self.frozen = nn.Linear(hidden, hidden)  # requires_grad=False below
        self.encode = nn.Linear(hidden, hidden, bias=False)
        self.decode = nn.Linear(hidden, hidden, bias=False)
        self.decode.weight = self.encode.weight  # one tensor, two modules: tied
        self.head = nn.Linear(hidden, CLASSES)
        self.unused = nn.Linear(hidden, 2)  # never called in forward
        self.register_buffer("scale", torch.tensor(0.5))  # read in forward
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        h = torch.tanh(self.frozen(h))
        h = torch.tanh(self.decode(torch.tanh(self.encode(h))))
        return self.head(h * self.scale)


class TinyNet(nn.Module):
    """A weight and a bias of one number each: fewer parameters than 3 or 4 ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.3]))
        self.bias = nn.Parameter(torch.tensor([-0.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = x[:, :1] * self.weight + self.bias  # (N, 1)
        return torch.cat([logit, -logit, torch.zeros_like(logit)], dim=1)  # (N, 3)


def hard_case_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> HardCaseNet:
    """A fresh HardCaseNet from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return HardCaseNet().to(dtype)


def tiny_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> TinyNet:
    """A fresh TinyNet in ``dtype`` (its weights do not depend on ``seed``)."""
    torch.manual_seed(seed)
    return TinyNet().to(dtype)


def hard_case_data(
    num_samples: int = NUM_SAMPLES, dtype: torch.dtype = torch.float64, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """X (num_samples, 6) of ``dtype`` and labels y (num_samples,) in 0..2."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(num_samples, IN_FEATURES, generator=generator).to(dtype)
    y = torch.randint(0, CLASSES, (num_samples,), generator=generator)
    return X, y


def trainable_numel(model: nn.Module) -> int:
    """Numbers the optimizer updates (a tied weight counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class LateUnitNet(nn.Module):
    """in (N, 6) -> logits (N, 3); ``late`` runs from the second forward on: a
    module (so an FSDP unit) that the first forward does not use and every later
    one does. The buffer ``calls`` counts the forwards."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, hidden)
        self.late = nn.Linear(hidden, hidden)  # not used by the first forward
        self.head = nn.Linear(hidden, CLASSES)
        self.register_buffer("calls", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        if self.calls > 0:
            h = h + torch.tanh(self.late(h))
        self.calls += 1
        return self.head(h)


class SpareBlock(nn.Module):
    """(N, h) -> (N, h) through ``linear``; ``spare`` is never read."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.spare = nn.Linear(hidden, hidden)  # no forward reads it

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(h))


class UnreadParameterNet(nn.Module):
    """in (N, 6) -> logits (N, 3) through embed, block, head: ``block`` (one module,
    so one FSDP unit, that every forward uses) holds ``block.spare``, which no
    forward reads, so its gradient stays None."""

    def __init__(self, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, hidden)
        self.block = SpareBlock(hidden)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.tanh(self.embed(x))))


def late_unit_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> LateUnitNet:
    """A fresh LateUnitNet from ``seed``, in ``dtype`` (``calls`` at 0)."""
    torch.manual_seed(seed)
    return LateUnitNet().to(dtype)


def unread_parameter_model(
    dtype: torch.dtype = torch.float64, seed: int = 0
) -> UnreadParameterNet:
    """A fresh UnreadParameterNet from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return UnreadParameterNet().to(dtype)
