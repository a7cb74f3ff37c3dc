"""The checker of notebook 08's exercise, where the learner writes the training step
(08)."""

from __future__ import annotations

import copy
import re

import torch
from torch import nn

from multigpu.allreduce_sgd import (
    Step,
    compare_with_reference,
    train_loop,
    train_one_process,
)
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.exercises._learner_code import ranks_were_stuck
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.allreduce_sgd import check_step_importable, train_data_parallel
from multigpu.runtime.launch import QUICK_TIMEOUT_S, WorkerError

TIMEOUT_S = QUICK_TIMEOUT_S  # a rank waiting longer in a collective is stuck: say so


def _max_loss_difference(a: History, b: History) -> float:
    return max(abs(x - y) for x, y in zip(a.step_loss, b.step_loss, strict=True))


def _no_gradient(parameters: list[nn.Parameter]) -> bool:
    return all(p.grad is None or not p.grad.any() for p in parameters)


def _watch_one_step(
    step: Step, model: nn.Module, X: torch.Tensor, y: torch.Tensor, config: TrainConfig
) -> list[str]:
    """What ``step`` does in one call, in order: "backward" (gradients computed),
    "step" (optimizer.step() called) and "step without gradients" (called when
    every gradient had been cleared); run on a copy, in this process (08)."""
    model = copy.deepcopy(model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum)
    events: list[str] = []
    for p in parameters:
        p.register_post_accumulate_grad_hook(lambda _: events.append("backward"))
    real_step = optimizer.step

    def watched_step(*args, **kwargs):
        events.append("step without gradients" if _no_gradient(parameters) else "step")
        return real_step(*args, **kwargs)

    optimizer.step = watched_step
    step(model, optimizer, X[: config.batch_size], y[: config.batch_size], config)
    return [e for i, e in enumerate(events) if i == 0 or events[i - 1] != e]


def _unchanged_weights(events: list[str]) -> str:
    """The FAIL for a step that never changed the weights, from what it did."""
    if "step without gradients" in events and "backward" in events:
        return (
            "FAIL: your step never changed the weights: the gradients were cleared "
            "between backward and the optimizer step, so optimizer.step() found no "
            "gradients to apply. Clear them before this step's backward pass, so "
            "that the step applies what its own backward computed."
        )
    if "backward" in events:
        return (
            "FAIL: your step computes gradients but never changes the weights: "
            "it never calls optimizer.step() after backward."
        )
    return (
        "FAIL: your step never changed the weights. After the forward pass, "
        "call loss.backward(), then optimizer.step()."
    )


def _raised(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[-1] if message else ''}"


def _failed_on_ranks(error: WorkerError, world_size: int) -> str:
    """The FAIL for a distributed run that stopped: stuck collectives or an error."""
    if ranks_were_stuck(error):
        return (
            f"FAIL: on {world_size} ranks the ranks stopped waiting for each other: "
            "a collective (an all-reduce) was called on some ranks and not on the "
            "others, or a different number of times, so those that called it waited "
            "for the rest. Every rank must make the same collective calls, in the "
            "same order (no collective under an if on the rank)."
        )
    raised = re.sub(r"^Rank \d+ of \d+ failed with ", "", str(error).strip())
    return (
        f"FAIL: on {world_size} ranks (distributed=True), rank {error.rank}'s step "
        f"raised {raised.splitlines()[0]}"
    )


def check_step(
    step: Step,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
    tolerance: float | None = None,
) -> ExerciseResult:
    """Does ``step`` train exactly like :func:`~multigpu.allreduce_sgd.sgd_step`?
    (passed, what to fix) (08).

    Trains with ``step`` in this process (``distributed=False``), then on
    ``world_size`` ranks (``distributed=True``), and compares each run with
    :func:`~multigpu.allreduce_sgd.train_one_process` on the same ``config``: the
    final weights and the loss of every step must agree within ``tolerance``. By
    default that is 1e-9 for a float64 model, whose rounding differences stay near
    1e-15, and 1e-3 otherwise (float32 rounding grows to about 1e-4 over dozens of
    steps). ``step`` has sgd_step's signature and lives in an importable module, like
    a worker.
    """
    check_step_importable(step)
    if tolerance is None:
        float64 = next(model.parameters()).dtype == torch.float64
        tolerance = 1e-9 if float64 else 1e-3
    reference = train_one_process(model, X, y, config)
    try:
        alone = train_loop(model, X, y, config, step=step)
    except Exception as error:  # the learner's code: name it, never a traceback
        if "process group" in str(error):
            return fail(
                "FAIL: in one process (distributed=False) your step called "
                "torch.distributed, which needs a process group, and there is none: "
                f"{_raised(error)} One process has nothing to all-reduce with; "
                "communicate only when distributed is True."
            )
        alone_raised = _raised(error)
        return fail(f"FAIL: in one process your step raised {alone_raised}")
    if max_parameter_difference(alone.parameters, cpu_state_dict(model)) == 0:
        return fail(_unchanged_weights(_watch_one_step(step, model, X, y, config)))
    weights = max_parameter_difference(alone.parameters, reference.parameters)
    if weights > tolerance:
        return fail(
            f"FAIL: in one process (distributed=False) your step ends {weights:.1e} "
            "away from sgd_step's weights. Clear the gradients "
            "(optimizer.zero_grad()), take the mean cross-entropy of model(X) "
            "against y, call loss.backward(), then optimizer.step()."
        )
    if _max_loss_difference(alone, reference) > tolerance:
        return fail(
            "FAIL: in one process your step trains like sgd_step, but the loss it "
            "returns is not the mean loss over its batch. Return loss.item()."
        )
    try:
        results = train_data_parallel(
            model, X, y, config, world_size, timeout=TIMEOUT_S, step=step
        )
    except WorkerError as error:
        return fail(_failed_on_ranks(error, world_size))
    identical, weights, losses = compare_with_reference(results, reference)
    if not identical:
        return fail(
            f"FAIL: the {world_size} ranks ended with different weights: each "
            "stepped with its own gradient. When distributed, all-reduce every "
            "gradient (a sum over the ranks) between backward() and step()."
        )
    if weights > tolerance:
        return fail(
            "FAIL: the ranks agree with each other, but end "
            f"{weights:.1e} away from one process on the global batch. Divide the "
            "summed gradients by the world size, once."
        )
    if losses > tolerance:
        return fail(
            "FAIL: the weights match one process, but on the ranks your step "
            "returns another loss: return the rank's own mean loss, loss.item()."
        )
    within = f"{tolerance:.0e}".replace("e-0", "e-")  # 1e-9, not 1e-09
    return ok(
        f"PASS: in one process and on {world_size} ranks your step trains like "
        f"sgd_step: the same weights, and the same loss at each of the "
        f"{len(reference.step_loss)} steps (within {within})."
    )
