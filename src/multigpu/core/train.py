"""The training vocabulary of the series, and the single-device baseline loop.

Every training loop of the series reads a :class:`TrainConfig`, returns a
:class:`History` and is judged with :func:`evaluate`: this module's :func:`train`
(the single-device loop taught in ``notebooks/01_single_device_baseline.ipynb``,
which every later notebook compares against), all-reduce SGD in
:mod:`multigpu.allreduce_sgd` (08) and the DDP notebooks after it.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm import tqdm

from multigpu.core.checks import check_choice, check_number, check_positive_int
from multigpu.core.data import check_batch_size
from multigpu.core.devices import Device, default_device, resolve_device
from multigpu.core.reproducibility import round_sig

# No elapsed time or rate in the bar: its text is the same on every run and machine,
# so stored notebook outputs stay comparable. Time per epoch is in History.seconds.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt}{postfix}"
ALLREDUCE_METHODS = ("naive", "ring", "torch")  # names accepted by `allreduce=`
REDUCTIONS = ("average", "scale_loss")  # names accepted by `reduction=`

# Labelled batches: a DataLoader, or [(X, y)] for one batch of tensors.
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a run; the same names in every notebook (01, 08).

    One process and a group of ranks read the same config: ``batch_size`` is the
    global batch, which data-parallel training splits over the ranks.
    """

    epochs: int = 5  # passes over the training set
    batch_size: int = 64  # samples per optimizer step, summed over all ranks
    lr: float = 0.05  # SGD learning rate
    momentum: float = 0.9  # SGD momentum
    seed: int = 0  # data order: epoch e shuffles with seed + e; weights: set_seed(seed)
    # The last two matter only with several ranks (08). How the ranks sum gradients:
    # "naive" or "ring" (multigpu.collectives), or "torch" (dist.all_reduce) ...
    allreduce: str = "ring"
    # ... and whether they "average" the gradients or "scale_loss" and sum them.
    reduction: str = "average"

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        check_positive_int("epochs", self.epochs)
        check_number("lr", self.lr, "Pass e.g. lr=0.05.")
        check_number(
            "momentum",
            self.momentum,
            "Pass e.g. momentum=0.9, or 0.0 for none.",
            allow_zero=True,
        )
        check_choice("all-reduce", self.allreduce, ALLREDUCE_METHODS)
        check_choice("reduction", self.reduction, REDUCTIONS)


@dataclass
class History:
    """What a run returns, from one process or from each rank (01, 08).

    The first four lists have one entry per epoch, ``step_loss`` one per step.
    """

    train_loss: list[float] = field(default_factory=list)  # mean over the epoch
    test_loss: list[float] = field(default_factory=list)  # empty without a test set
    test_accuracy: list[float] = field(default_factory=list)  # fraction in [0, 1]
    seconds: list[float] = field(default_factory=list)  # wall time of each epoch
    step_loss: list[float] = field(default_factory=list)  # mean over this rank's batch
    # The final weights (the model's state_dict) on the CPU; the same on every rank.
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)
    rank: int = 0  # the rank that trained; 0 for one process
    world_size: int = 1  # ranks that trained together; 1 for one process

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


def cpu_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's weights on the CPU, comparable anywhere (01, 08)."""
    return {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in model.state_dict().items()
    }


def evaluation_sums(
    model: nn.Module, batches: Batches, device: torch.device | None = None
) -> tuple[float, int, int]:
    """``(sum of cross-entropy losses, correct predictions, samples)`` of ``model``
    over labelled ``batches``, in eval mode and without gradients (01, 09).

    Sums rather than means, so that sums over parts (the ranks' shards in 09) add
    up to the sums over the whole. The loss is added up batch by batch as a Python
    float (float64). ``device``: where the batches go (the model must be there); by
    default, where the model's weights are. The model's training mode is restored.
    """
    if device is None:
        weight = next(model.parameters(), None)
        device = weight.device if weight is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        with torch.no_grad():
            for X, y in batches:
                X, y = X.to(device), y.to(device)
                logits = model(X)  # (batch, classes)
                loss = nn.functional.cross_entropy(logits, y, reduction="sum")
                total_loss += loss.item()
                correct += (logits.argmax(dim=1) == y).sum().item()
                count += len(y)
    finally:
        model.train(was_training)
    return total_loss, correct, count


def evaluate(
    model: nn.Module,
    batches: Batches,
    device: Device | torch.device | str | None = None,
    parameters: dict[str, torch.Tensor] | None = None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over labelled ``batches`` (01, 08).

    ``batches``: a DataLoader, or ``[(X, y)]`` for tensors X (N, ...), y (N,).
    ``parameters``: a state_dict to evaluate instead of the model's own weights;
    ``model`` then only gives the architecture and is not changed.
    ``device``: where the batches go (the model must be there); by default, where
    the model's weights are. The sums behind the means: :func:`evaluation_sums`.
    """
    if parameters is not None:
        model = copy.deepcopy(model)  # the caller's model keeps its weights
        model.load_state_dict(parameters)
    target = None if device is None else resolve_device(device).torch_device
    total_loss, correct, count = evaluation_sums(model, batches, target)
    if count == 0:
        raise ValueError(
            "evaluate got no samples: the batches are empty. Pass a DataLoader over "
            "a non-empty dataset, or [(X, y)] with at least one sample."
        )
    return total_loss / count, correct / count


def train(
    model: nn.Module,
    train_loader: Batches,
    config: TrainConfig,
    device: Device | str | None = None,
    test_loader: Batches | None = None,
    progress: bool = True,
) -> History:
    """Train with SGD on one device; return the run's History (01).

    Seed before building the model and the loader (``set_seed``) for repeatable runs.
    ``config.allreduce`` and ``config.reduction`` are not used.
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
        sampler = getattr(train_loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # a new order each epoch, from the seed
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
            history.step_loss.append(loss.item())
            total += history.step_loss[-1] * len(y)
            count += len(y)
            batches.set_postfix(loss=f"{total / count:.3f}", refresh=False)
        batches.close()
        if count == 0:
            raise ValueError(
                "train_loader gave no batches, so there is nothing to train on. "
                "Check that the dataset is not empty and, with drop_last=True, that "
                "it holds at least one full batch."
            )
        history.train_loss.append(total / count)
        if test_loader is not None:
            test_loss, accuracy = evaluate(model, test_loader, target)
            history.test_loss.append(test_loss)
            history.test_accuracy.append(accuracy)
        history.seconds.append(time.perf_counter() - start)
    history.parameters = cpu_state_dict(model)
    return history
