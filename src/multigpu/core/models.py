"""Models: the small ConvNet used throughout, and a torchvision ResNet for GPU runs.

Taught in ``notebooks/01_single_device_baseline.ipynb``. ``ConvNet(batch_norm=True)``
shows BatchNorm under DataParallel (05). Two small wrappers serve the DataParallel
pitfalls: ``TemperatureNet`` takes a keyword argument next to its input (04) and
``LossNet`` returns its loss from ``forward`` (05). ``TiedFrozenNet`` has every case
a sharded wrapper can get wrong (14; the tests' hard cases).
"""

from __future__ import annotations

import torch
from torch import nn

from multigpu.core.checks import check_positive_int


class ConvNet(nn.Module):
    """Two 3x3 conv layers, adaptive pooling and a linear classifier.

    Works for any image size (8x8 digits, 28x28 MNIST, 32x32 CIFAR-10):
    (batch, in_channels, H, W) -> (batch, num_classes) logits. With
    ``batch_norm=True`` each conv is followed by a BatchNorm (and has no bias), so
    in training mode every row's output depends on the whole batch (05).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        width: int = 16,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        for label, value, default in (
            ("in_channels", in_channels, 1),
            ("num_classes", num_classes, 10),
            ("width", width, 16),
        ):
            check_positive_int(
                label, value, f"Pass a whole number, e.g. ConvNet({label}={default})."
            )

        def block(cin: int, cout: int) -> list[nn.Module]:
            norm = [nn.BatchNorm2d(cout)] if batch_norm else []
            return [
                nn.Conv2d(cin, cout, 3, padding=1, bias=not batch_norm),
                *norm,
                nn.ReLU(),
            ]

        self.features = nn.Sequential(
            *block(in_channels, width),
            *block(width, 2 * width),
            nn.AdaptiveAvgPool2d(2),  # (batch, 2*width, 2, 2) whatever H, W
        )
        self.classifier = nn.Linear(2 * width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (batch, in_channels, H, W)
        return self.classifier(self.features(x).flatten(1))  # (batch, num_classes)


def resnet(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """torchvision's ResNet-18 with random weights, for runs on real GPUs (01)."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


def mlp(
    in_features: int = 64, width: int = 256, depth: int = 6, num_classes: int = 10
) -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units with ReLU: layers of equal size, so
    backward spends about the same time on each, and a bucket of gradients can
    travel while the layers below are still computing (10).
    (batch, in_features) -> (batch, num_classes)."""
    layers: list[nn.Module] = [nn.Flatten()]
    size = in_features
    for _ in range(depth):
        layers += [nn.Linear(size, width), nn.ReLU()]
        size = width
    layers.append(nn.Linear(size, num_classes))
    return nn.Sequential(*layers)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars in ``model`` (01)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class TiedFrozenNet(nn.Module):
    """(N, inputs) -> logits (N, classes) through embed, frozen, encode, decode
    (encode's weight, tied), head; ``unused`` is never called (14).

    A weight tied between two layers, a frozen layer, a layer never called in
    forward and a buffer read in forward, and a parameter count that no world size
    from 2 to 4 divides: the hard cases of the tests (``tests/hard_cases.py``), as
    a model a notebook can hand to its ranks."""

    def __init__(self, inputs: int = 6, hidden: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(inputs, hidden)
        self.frozen = nn.Linear(hidden, hidden).requires_grad_(False)
        self.encode = nn.Linear(hidden, hidden, bias=False)
        self.decode = nn.Linear(hidden, hidden, bias=False)
        self.decode.weight = self.encode.weight  # one tensor, two modules: tied
        self.head = nn.Linear(hidden, classes)
        self.unused = nn.Linear(hidden, 2)  # never called in forward
        self.register_buffer("scale", torch.tensor(0.5))  # read in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        h = torch.tanh(self.frozen(h))
        h = torch.tanh(self.decode(torch.tanh(self.encode(h))))
        return self.head(h * self.scale)


class TemperatureNet(nn.Module):
    """ConvNet logits divided by a temperature: (batch, 1, 8, 8) -> (batch, 10) (04)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ConvNet()

    def forward(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return self.net(x) / temperature


class LossNet(nn.Module):
    """A classifier whose forward returns its loss (05).

    (batch, 1, 8, 8), (batch,) -> a scalar, or (batch,) with ``reduction="none"``.
    """

    def __init__(self, net: nn.Module, reduction: str = "mean") -> None:
        super().__init__()
        self.net = net
        self.reduction = reduction  # "mean" or "sum": a scalar; "none": (batch,)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)  # (batch, 10)
        return nn.functional.cross_entropy(logits, y, reduction=self.reduction)


def flat_gradients(model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    """Zero ``model``'s gradients, backpropagate ``loss`` and return every gradient
    as one flat vector, in ``model.parameters()`` order (05)."""
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])
