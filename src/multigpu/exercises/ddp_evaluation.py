"""The checkers of notebook 09's exercises: exact distributed evaluation (every
sample once, sums all-reduced, divided by the true N) and the learner's DDP
script's final weights, compared with one process and with the weights each common
mistake of such a script gives (09)."""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.functional import cross_entropy
from torch.utils.data import DataLoader, TensorDataset

from multigpu.core.compare import max_parameter_difference
from multigpu.core.data import get_dataset, tensors
from multigpu.core.models import ConvNet
from multigpu.core.reproducibility import set_seed
from multigpu.core.train import cpu_state_dict
from multigpu.ddp import sampler_shards
from multigpu.exercises._learner_code import ranks_were_stuck
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.ddp_pitfalls import SampleLookupNet, counted_evaluation_rank
from multigpu.runtime.launch import QUICK_TIMEOUT_S, WorkerError, spawn

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


def check_evaluation(evaluation: Callable[..., Any]) -> ExerciseResult:
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
    try:
        runs = spawn(
            counted_evaluation_rank,
            WORLD_SIZE,
            evaluation,
            model,
            X,
            y,
            timeout=QUICK_TIMEOUT_S,
        )
    except WorkerError as error:
        return fail(_launch_mistake(name, error))
    problem = _sample_mistake([run["seen"] for run in runs])
    if problem:
        return fail(problem)
    results = [_as_pair(run["result"]) for run in runs]
    if any(result is None for result in results):
        return fail(
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
            "not shared: each rank must evaluate only its own shard, and the shards "
            "together must hold every sample once (the sampler's stride, without "
            "its padding). Then add up the ranks' sums."
        )
    counts = [sum(index in shown for shown in seen) for index in everything]
    twice = [index for index, count in enumerate(counts) if count > 1]
    if twice:
        return (
            f"FAIL: samples {twice} were evaluated on more than one rank, so they "
            "count twice; that is DistributedSampler's padding, which repeats "
            "samples to give every rank as many. Every sample must belong to "
            "exactly one rank, even if the shards then differ in length."
        )
    never = [index for index, count in enumerate(counts) if count == 0]
    if never:
        return (
            f"FAIL: samples {never} were evaluated on no rank (dropped, as "
            "drop_last=True does), so the result leaves them out. Every sample must "
            "belong to exactly one rank, the last N mod world_size too."
        )
    return None


def _launch_mistake(name: str, error: WorkerError) -> str:
    """The FAIL for a launch that stopped: a collective only some ranks called, or
    the learner's exception."""
    stuck = ranks_were_stuck(error)
    if stuck:
        returned = ", ".join(str(rank) for rank in error.returned_ranks)
        who = f" while ranks {returned} had returned" if returned else ""
        return (
            f"FAIL: rank {error.rank} waited in a collective that not every rank "
            f"called{who}: a deadlock. An all-reduce that only some ranks reach (under "
            "an if on the rank, say) waits for the others forever. Every rank must "
            "make the same collective calls; only printing may depend on the rank."
        )
    raised = re.sub(r"^Rank \d+ of \d+ failed with ", "", str(error).strip())
    return f"FAIL: on rank {error.rank}, {name} raised {raised.splitlines()[0]}"


def _number_mistake(
    name: str, model: SampleLookupNet, y: torch.Tensor, results: list
) -> ExerciseResult:
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
        return fail(
            f"FAIL: the ranks returned different numbers{which}: each reported its "
            "own shard only. The sums of loss, correct predictions and samples "
            "must be added up over the ranks (a collective) before dividing, so "
            "that every rank returns the numbers of all the samples."
        )
    if _close(results[0], truth):
        return ok(
            f"PASS: {name} counts each of the {NUM_SAMPLES} samples once on "
            f"{WORLD_SIZE} ranks and returns one process's loss and accuracy "
            f"({truth[1]:.2f})."
        )
    means = [(s[0] / s[2], s[1] / s[2]) for s in per_rank]
    mean_of_means = tuple(sum(column) / WORLD_SIZE for column in zip(*means))
    padded_total = WORLD_SIZE * math.ceil(NUM_SAMPLES / WORLD_SIZE)
    if _close(results[0], mean_of_means):
        return fail(
            "FAIL: you averaged the ranks' means, but the shards have unequal sizes "
            f"({', '.join(str(len(s)) for s in shards)}), so a sample on a smaller "
            "shard weighs more. All-reduce the sums and the count, then divide."
        )
    if _close(results[0], (loss / padded_total, correct / padded_total)):
        return fail(
            f"FAIL: you divided by {padded_total}, the padded total (every rank "
            "counted as if it held as many samples as the longest shard), but only "
            f"{NUM_SAMPLES} samples exist: the sums were divided by samples that "
            "were never evaluated."
        )
    return fail(
        f"FAIL: every sample was counted once, but the ranks returned loss "
        f"{results[0][0]:.4f}, accuracy {results[0][1]:.4f}; one process gets "
        f"{truth[0]:.4f}, {truth[1]:.4f}: the mean loss and the accuracy of all "
        "the samples, each a sum over every rank divided by the number of samples."
    )


# Exercise 3's run: set_seed(0), a float64 ConvNet, the first 256 training digits,
# 2 epochs of global batches of 64, lr 0.05, momentum 0.9, on 2 ranks.
SCRIPT_SAMPLES, SCRIPT_EPOCHS, GLOBAL_BATCH, LR, MOMENTUM = 256, 2, 64, 0.05, 0.9
_SAME = 1e-9  # weights this close came from the same run (rounding aside)


def _script_problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Exercise 3's model (seeded as the script seeds it) and data; this reseeds
    every generator, so :func:`check_trained_weights` restores them after (09)."""
    set_seed(0)
    model = ConvNet().double()
    X, y = tensors(get_dataset("digits", train=True))
    return model, X[:SCRIPT_SAMPLES].double(), y[:SCRIPT_SAMPLES]


def _train_like_ddp(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    epoch_batches: Callable[[int], list[list[torch.Tensor]]],
) -> dict[str, torch.Tensor]:
    """The weights DDP reaches when, in epoch e, step k gives rank r the indices
    ``epoch_batches(e)[k][r]``: one process, each step on the mean of the ranks'
    mean losses (DDP averages their gradients) (09)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for epoch in range(SCRIPT_EPOCHS):
        for per_rank in epoch_batches(epoch):
            optimizer.zero_grad()
            losses = [cross_entropy(model(X[i]), y[i]) for i in per_rank]
            (sum(losses) / len(losses)).backward()
            optimizer.step()
    return cpu_state_dict(model)


def _sampler_batches(
    world_size: int, per_rank_batch: int, set_epoch: bool
) -> Callable[[int], list[list[torch.Tensor]]]:
    """Each rank's batches from a DistributedSampler(drop_last=True) and a loader
    with ``drop_last=True``; without ``set_epoch`` every epoch is epoch 0's order."""

    def batches(epoch: int) -> list[list[torch.Tensor]]:
        shards = [
            torch.tensor(shard).split(per_rank_batch)
            for shard in sampler_shards(
                SCRIPT_SAMPLES,
                world_size,
                shuffle=True,
                epoch=epoch if set_epoch else 0,
                drop_last=True,
            )
        ]
        steps = min(sum(len(b) == per_rank_batch for b in s) for s in shards)
        return [[shard[k] for shard in shards] for k in range(steps)]

    return batches


@functools.cache
def _mistakes(world_size: int) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """(mistake, the weights exercise 3's script ends at with it), for each common
    mistake; "no sampler" twice, with the loader shuffling or not (09)."""
    per_rank = GLOBAL_BATCH // world_size
    runs = [
        ("no set_epoch", _sampler_batches(world_size, per_rank, set_epoch=False)),
        ("per-rank batch", _sampler_batches(world_size, GLOBAL_BATCH, set_epoch=True)),
    ]
    found = []
    for mistake, batches in runs:
        model, X, y = _script_problem()
        found.append((mistake, _train_like_ddp(model, X, y, batches)))
    for shuffle in (False, True):  # no sampler: every rank loads the same batches
        model, X, y = _script_problem()  # the loader draws its order from here on
        loader = DataLoader(
            TensorDataset(torch.arange(SCRIPT_SAMPLES)),
            batch_size=per_rank,
            shuffle=shuffle,
            drop_last=True,
        )

        def same_on_every_rank(epoch: int, loader=loader) -> list[list[torch.Tensor]]:
            return [[indices] * world_size for (indices,) in loader]

        found.append(("no sampler", _train_like_ddp(model, X, y, same_on_every_rank)))
    return found


MISTAKES = {
    "no set_epoch": (
        "FAIL: your weights are those of a run in which every epoch repeats the "
        "first epoch's order: the sampler shuffles with its seed plus the epoch, and "
        "it was never told the epoch, so it stayed 0. The sampler needs the epoch at "
        "the start of each one (set_epoch)."
    ),
    "per-rank batch": (
        "FAIL: your weights are those of a run with a global batch of {doubled}: "
        "each rank's loader took {batch} samples, the whole global batch, so every "
        "step averaged {doubled} samples and an epoch had {world_size} times fewer "
        "steps. The "
        "loader's batch size is per rank: the ranks share the global batch."
    ),
    "no sampler": (
        "FAIL: your weights are those of a run in which every rank loaded the same "
        "batches: without a DistributedSampler each rank's loader goes through the "
        "whole dataset, so the ranks average identical gradients, and an epoch "
        "takes {world_size} times as many steps. Each rank needs its own share of "
        "every epoch."
    ),
}


def check_trained_weights(
    weights: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    world_size: int = 2,
) -> ExerciseResult:
    """Do the weights a learner's DDP script saved equal one process's on the
    global batch (float64, to 1e-12)? (passed, message naming the mistake) (09,
    exercise 3).

    ``reference`` is one process's weights on exercise 3's run; when ``weights``
    differ, they are compared with the weights of that run on ``world_size`` ranks
    with each common mistake: no ``set_epoch``, a per-rank batch of the global
    batch's size, no ``DistributedSampler``."""
    if any(key.startswith("module.") for key in weights):
        return fail(
            "FAIL: the saved keys start with 'module.': you saved the DDP wrapper's "
            "state_dict. Save model.module.state_dict() on rank 0."
        )
    if set(weights) != set(reference):
        return fail(
            f"FAIL: the saved keys {sorted(weights)} are not ConvNet's "
            f"{sorted(reference)}. Save model.module.state_dict() on rank 0."
        )
    difference = max_parameter_difference(weights, reference)
    if difference <= 1e-12:
        return ok(
            f"PASS: your script on {world_size} ranks ends at the weights of one "
            "process on the global batch (max difference below 1e-12)."
        )
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        mistakes = _mistakes(world_size)
    finally:  # the learner's generators go on as if nothing had run
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    for mistake, theirs in mistakes:
        if max_parameter_difference(weights, theirs) < _SAME:
            return fail(
                MISTAKES[mistake].format(
                    batch=GLOBAL_BATCH,
                    doubled=GLOBAL_BATCH * world_size,
                    world_size=world_size,
                )
            )
    return fail(
        f"FAIL: your weights are {difference:.1e} away from one process on the "
        "global batch, and from what the common mistakes give (a sampler never "
        "told the epoch, a per-rank batch as large as the global one, no sampler). "
        "Compare your script with section 1's loop: the data, the seed before the "
        "model, float64, the learning rate and the momentum."
    )
