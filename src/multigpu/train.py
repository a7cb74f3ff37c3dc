"""The single-device baseline: seeding, a training loop, evaluation, history.

Taught in ``notebooks/01_single_device_baseline.ipynb``; every later notebook
compares its numbers against this loop.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from .data import check_batch_size
from .devices import Device, default_device, resolve_device
from .reproducibility import round_sig

# No elapsed time or rate in the bar: its text is the same on every run and machine,
# so stored notebook outputs stay comparable. Time per epoch is in History.seconds.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt}{postfix}"


@dataclass
class TrainConfig:
    """Hyper-parameters of a run; the same names are used in every notebook."""

    epochs: int = 5  # passes over the training set
    batch_size: int = 64  # samples per optimizer step (the global batch)
    lr: float = 0.05  # SGD learning rate
    momentum: float = 0.9  # SGD momentum
    seed: int = 0  # seeds the model's initial weights and the data order

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(
                f"epochs must be an integer of at least 1, got {self.epochs!r}."
            )
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}.")


@dataclass
class History:
    """Per-epoch numbers of a run (one entry per epoch in each list)."""

    train_loss: list[float] = field(default_factory=list)  # mean over the epoch
    test_loss: list[float] = field(default_factory=list)  # empty without a test set
    test_accuracy: list[float] = field(default_factory=list)  # fraction in [0, 1]
    seconds: list[float] = field(default_factory=list)  # wall time of each epoch

    def rows(self, digits: int = 4) -> list[dict[str, float]]:
        """One dict per epoch, numbers to ``digits`` significant digits (no timings)."""
        rows = []
        for i, loss in enumerate(self.train_loss):
            row = {"epoch": i + 1, "train_loss": round_sig(loss, digits)}
            if self.test_loss:
                row["test_loss"] = round_sig(self.test_loss[i], digits)
                row["test_accuracy"] = round_sig(self.test_accuracy[i], digits)
            rows.append(row)
        return rows


def evaluate(
    model: nn.Module, loader: DataLoader, device: Device | str | None = None
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` over ``loader`` (01)."""
    target = (resolve_device(device) if device else default_device()).torch_device
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for X, y in loader:
            X, y = X.to(target), y.to(target)
            logits = model(X)  # (batch, classes)
            total_loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            count += len(y)
    model.train(was_training)
    return total_loss / count, correct / count


def train(
    model: nn.Module,
    train_loader: DataLoader,
    config: TrainConfig,
    device: Device | str | None = None,
    test_loader: DataLoader | None = None,
    progress: bool = True,
) -> History:
    """Train with SGD on one device; return per-epoch history (01).

    Seed before building the model and the loader (``set_seed``) for repeatable runs.
    """
    target = (resolve_device(device) if device else default_device()).torch_device
    model.to(target)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    history = History()
    for epoch in range(config.epochs):
        start = time.perf_counter()
        model.train()
        if hasattr(train_loader, "sampler") and hasattr(
            train_loader.sampler, "set_epoch"
        ):
            train_loader.sampler.set_epoch(
                epoch
            )  # a new order each epoch, from the seed
        total, count = 0.0, 0
        batches = tqdm(
            train_loader,
            desc=f"epoch {epoch + 1}/{config.epochs}",
            disable=not progress,
            bar_format=BAR_FORMAT,
            file=sys.stderr,
            mininterval=0.5,
        )
        for X, y in batches:
            X, y = X.to(target), y.to(target)  # (batch, C, H, W), (batch,)
            loss = nn.functional.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
            batches.set_postfix(loss=f"{total / count:.3f}", refresh=False)
        batches.close()
        history.train_loss.append(total / count)
        if test_loader is not None:
            test_loss, accuracy = evaluate(model, test_loader, device)
            history.test_loss.append(test_loss)
            history.test_accuracy.append(accuracy)
        history.seconds.append(time.perf_counter() - start)
    return history
