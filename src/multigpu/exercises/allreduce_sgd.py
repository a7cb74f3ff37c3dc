"""The checker of notebook 08's exercise, where the learner writes the training step
(08)."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.allreduce_sgd import (
    Step,
    compare_with_reference,
    train_loop,
    train_single_process,
)
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.ranks.allreduce_sgd import check_step_importable, train_data_parallel


def _max_loss_difference(a: History, b: History) -> float:
    return max(abs(x - y) for x, y in zip(a.step_loss, b.step_loss, strict=True))


def check_step(
    step: Step,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
    tolerance: float | None = None,
) -> tuple[bool, str]:
    """Does ``step`` train exactly like :func:`~multigpu.allreduce_sgd.sgd_step`?
    (passed, what to fix) (08).

    Trains with ``step`` in this process (``distributed=False``), then on
    ``world_size`` ranks (``distributed=True``), and compares each run with
    :func:`~multigpu.allreduce_sgd.train_single_process` on the same ``config``: the
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
    reference = train_single_process(model, X, y, config)
    try:
        alone = train_loop(model, X, y, config, step=step)
    except (RuntimeError, ValueError) as error:
        if "process group" not in str(error):
            raise
        raise RuntimeError(
            "Your step called torch.distributed in one process (distributed=False), "
            "where there is no process group. All-reduce only when distributed is "
            "True."
        ) from error
    if max_parameter_difference(alone.parameters, cpu_state_dict(model)) == 0:
        return False, (
            "FAIL: your step never changed the weights. After the forward pass, "
            "call loss.backward(), then optimizer.step()."
        )
    weights = max_parameter_difference(alone.parameters, reference.parameters)
    if weights > tolerance:
        return False, (
            f"FAIL: in one process (distributed=False) your step ends {weights:.1e} "
            "away from sgd_step's weights. Clear the gradients "
            "(optimizer.zero_grad()), take the mean cross-entropy of model(X) "
            "against y, call loss.backward(), then optimizer.step()."
        )
    if _max_loss_difference(alone, reference) > tolerance:
        return False, (
            "FAIL: in one process your step trains like sgd_step, but the loss it "
            "returns is not the mean loss over its batch. Return loss.item()."
        )
    results = train_data_parallel(model, X, y, config, world_size, step=step)
    identical, weights, losses = compare_with_reference(results, reference)
    if not identical:
        return False, (
            f"FAIL: the {world_size} ranks ended with different weights: each "
            "stepped with its own gradient. When distributed, all-reduce every "
            "gradient (a sum over the ranks) between backward() and step()."
        )
    if weights > tolerance:
        return False, (
            "FAIL: the ranks agree with each other, but end "
            f"{weights:.1e} away from one process on the global batch. Divide the "
            "summed gradients by the world size, once."
        )
    if losses > tolerance:
        return False, (
            "FAIL: the weights match one process, but on the ranks your step "
            "returns another loss: return the rank's own mean loss, loss.item()."
        )
    within = f"{tolerance:.0e}".replace("e-0", "e-")  # 1e-9, not 1e-09
    return True, (
        f"PASS: in one process and on {world_size} ranks your step trains like "
        f"sgd_step: the same weights, and the same loss at each of the "
        f"{len(reference.step_loss)} steps (within {within})."
    )
