"""The checkers of notebook 09's exercises: exact distributed evaluation (every
sample once, sums all-reduced, divided by the true N) and the learner's DDP
script's final weights (09)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from multigpu.core.compare import max_parameter_difference
from multigpu.ranks.ddp_pitfalls import SampleLookupNet, counted_evaluation_rank
from multigpu.runtime.launch import spawn

NUM_SAMPLES = 10  # on 4 ranks: shards of 3, 3, 2, 2; the padded sampler repeats 0, 1
WORLD_SIZE = 4
RIGHT = 4  # samples 0-3 are predicted right, so the padding repeats right ones
_TOLERANCE = 1e-9


def evaluation_problem() -> tuple[SampleLookupNet, torch.Tensor, torch.Tensor]:
    """The checker's data: ``X`` (10, 1) holds each sample's index, ``y`` (10,)
    its label, and the model predicts samples 0-3 right and 4-9 wrong, with a
    different loss for every sample (float64) (09)."""
    logits = torch.zeros(NUM_SAMPLES, 3, dtype=torch.float64)
    logits[:, 0] = 0.5 + 0.25 * torch.arange(NUM_SAMPLES, dtype=torch.float64)
    y = torch.where(torch.arange(NUM_SAMPLES) < RIGHT, 0, 1)
    X = torch.arange(NUM_SAMPLES, dtype=torch.float64).unsqueeze(1)
    return SampleLookupNet(logits), X, y


def _sums(model: SampleLookupNet, indices: list[int], y: torch.Tensor) -> tuple:
    """(sum of losses, correct, count) over ``indices``, without noting them."""
    logits, labels = model.logits[indices], y[indices]
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    return loss.item(), (logits.argmax(1) == labels).sum().item(), len(indices)


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(abs(x - z) <= _TOLERANCE for x, z in zip(a, b, strict=True))


def _as_pair(result: Any) -> tuple[float, float] | None:
    try:
        loss, accuracy = result
        return float(loss), float(accuracy)
    except (TypeError, ValueError):
        return None


def check_evaluation(evaluation: Callable[..., Any]) -> tuple[bool, str]:
    """Does ``evaluation(model, X, y) -> (mean loss, accuracy)``, called on every
    rank of a process group, count every sample exactly once and return what one
    process computes? (passed, what to fix) (09).

    Runs it on 4 ranks over 10 samples (:func:`evaluation_problem`), notes which
    samples each rank showed the model, and names the mistake: a rank that
    evaluates everything, padded (repeated) or dropped samples, ranks that disagree
    (no all-reduce), the mean of per-rank means, or a division by the padded total.
    ``evaluation`` must live in a module the ranks can import (a ``%%module``
    cell)."""
    name = getattr(evaluation, "__name__", repr(evaluation))
    if getattr(evaluation, "__module__", None) in ("__main__", "__mp_main__"):
        raise TypeError(
            f"{name} is defined in the notebook, so the ranks cannot import it. "
            "Write it in a %%module cell and import it from there."
        )
    model, X, y = evaluation_problem()
    runs = spawn(
        counted_evaluation_rank, WORLD_SIZE, evaluation, model, X, y, timeout=60.0
    )
    problem = _sample_mistake([run["seen"] for run in runs])
    if problem:
        return False, problem
    results = [_as_pair(run["result"]) for run in runs]
    if any(result is None for result in results):
        return False, (
            f"FAIL: {name} must return two numbers, (mean loss, accuracy); it "
            f"returned {runs[results.index(None)]['result']!r}."
        )
    return _number_mistake(name, model, y, results)


def _sample_mistake(seen: list[list[int]]) -> str | None:
    """What is wrong with the samples each rank evaluated, or None."""
    everything = list(range(NUM_SAMPLES))
    if all(shown == everything for shown in seen):
        return (
            f"FAIL: every rank evaluated all {NUM_SAMPLES} samples, so the work was "
            "not shared. Give rank r only the samples r, r + world_size, ... "
            "(torch.arange(rank, len(y), world_size)), then add up the sums."
        )
    counts = [sum(index in shown for shown in seen) for index in everything]
    twice = [index for index, count in enumerate(counts) if count > 1]
    if twice:
        return (
            f"FAIL: samples {twice} were evaluated on more than one rank, so they "
            "count twice; that is DistributedSampler's padding. Shard by index "
            "without padding: torch.arange(rank, len(y), world_size)."
        )
    never = [index for index, count in enumerate(counts) if count == 0]
    if never:
        return (
            f"FAIL: samples {never} were evaluated on no rank (dropped, as "
            "drop_last=True does). Shard by index so that every sample belongs to "
            "one rank: torch.arange(rank, len(y), world_size)."
        )
    return None


def _number_mistake(
    name: str, model: SampleLookupNet, y: torch.Tensor, results: list
) -> tuple[bool, str]:
    """Compare the ranks' (loss, accuracy) with one process's and name the
    mistake whose numbers they match."""
    shards = [list(range(rank, NUM_SAMPLES, WORLD_SIZE)) for rank in range(WORLD_SIZE)]
    per_rank = [_sums(model, shard, y) for shard in shards]
    loss, correct, count = (sum(column) for column in zip(*per_rank, strict=True))
    truth = (loss / count, correct / count)
    if any(not _close(result, results[0]) for result in results[1:]):
        own = (per_rank[0][0] / per_rank[0][2], per_rank[0][1] / per_rank[0][2])
        which = (
            " (rank 0's numbers are its own shard's)" if _close(results[0], own) else ""
        )
        return False, (
            f"FAIL: the ranks returned different numbers{which}: each reported its "
            "own shard only. All-reduce the sums of loss, correct predictions and "
            "samples (dist.all_reduce, op SUM) before dividing."
        )
    if _close(results[0], truth):
        return True, (
            f"PASS: {name} counts each of the {NUM_SAMPLES} samples once on "
            f"{WORLD_SIZE} ranks and returns one process's loss and accuracy "
            f"({truth[1]:.2f})."
        )
    means = [(s[0] / s[2], s[1] / s[2]) for s in per_rank]
    mean_of_means = tuple(sum(column) / WORLD_SIZE for column in zip(*means))
    padded_total = WORLD_SIZE * math.ceil(NUM_SAMPLES / WORLD_SIZE)
    if _close(results[0], mean_of_means):
        return False, (
            "FAIL: you averaged the ranks' means, but the shards have unequal sizes "
            f"({', '.join(str(len(s)) for s in shards)}), so a sample on a smaller "
            "shard weighs more. All-reduce the sums and the count, then divide."
        )
    if _close(results[0], (loss / padded_total, correct / padded_total)):
        return False, (
            f"FAIL: you divided by {padded_total} = world_size x ceil(N / "
            "world_size), the padded total. Divide the summed loss and correct "
            f"predictions by the number of samples, N = {NUM_SAMPLES}."
        )
    return False, (
        f"FAIL: every sample was counted once, but the ranks returned loss "
        f"{results[0][0]:.4f}, accuracy {results[0][1]:.4f}; one process gets "
        f"{truth[0]:.4f}, {truth[1]:.4f}. Return (summed loss / N, correct / N), "
        "with sums all-reduced over the ranks."
    )


def check_trained_weights(
    weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]
) -> tuple[bool, str]:
    """Do the weights a learner's DDP script saved equal one process's on the
    global batch (float64, to 1e-12)? (passed, what to fix) (09, exercise 3)."""
    if any(key.startswith("module.") for key in weights):
        return False, (
            "FAIL: the saved keys start with 'module.': you saved the DDP wrapper's "
            "state_dict. Save model.module.state_dict() on rank 0."
        )
    if set(weights) != set(reference):
        return False, (
            f"FAIL: the saved keys {sorted(weights)} are not ConvNet's "
            f"{sorted(reference)}. Save model.module.state_dict() on rank 0."
        )
    difference = max_parameter_difference(weights, reference)
    if difference > 1e-12:
        return False, (
            f"FAIL: your weights are {difference:.1e} away from one process on the "
            "global batch. Check the sampler (DistributedSampler(drop_last=True), "
            "set_epoch every epoch), the batch of 64 // world_size, lr 0.05, "
            "momentum 0.9, set_seed(0) before building the model, and float64."
        )
    return True, (
        "PASS: your script on 2 ranks ends at the weights of one process on the "
        "global batch (max difference below 1e-12)."
    )
