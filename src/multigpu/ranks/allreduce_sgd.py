"""The ranks of notebook 08 and the launchers that start them: each rank trains with
:func:`multigpu.allreduce_sgd.train_loop` on its shard of every global batch (08)."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.allreduce_sgd import Step, sgd_step, train_loop
from multigpu.core.batches import per_rank_batch_size
from multigpu.core.train import History, TrainConfig
from multigpu.runtime.launch import (
    DEFAULT_DEADLINE_S,
    DEFAULT_TIMEOUT_S,
    WorkerNotImportableError,
    check_importable,
    spawn,
)


def train_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    configs: dict[str, TrainConfig],
    step: Step = sgd_step,
) -> dict[str, History]:
    """What each process runs: one training run per named config, in order (08)."""
    return {
        name: train_loop(model, X, y, config, rank, world_size, True, step)
        for name, config in configs.items()
    }


def check_step_importable(step: Step) -> None:
    """Raise unless new processes can import ``step`` by its module and name (08).

    :func:`multigpu.runtime.launch.check_importable` decides; the error says what
    to do about a step (a learner's function) rather than about a worker.
    """
    fix = (
        "Write it into a module file in a folder on sys.path (in a notebook, with "
        "%%writefile), import it from there and pass the imported function."
    )
    if not callable(step):
        raise TypeError(
            f"step must be a function like sgd_step, got {type(step).__name__}. {fix}"
        )
    try:
        check_importable(step)
    except WorkerNotImportableError:
        module = getattr(step, "__module__", None)
        name = getattr(step, "__qualname__", None) or repr(step)
        if module in (None, "__main__", "__mp_main__") or "<" in name:
            raise WorkerNotImportableError(
                f"The step {name!r} is defined in a notebook or script, or inside a "
                f"function, so the ranks cannot import it. {fix}"
            ) from None
        raise WorkerNotImportableError(
            f"The step {name!r} cannot be found as {module}.{name}, so the ranks "
            f"cannot import it (after editing its file, import it again). {fix}"
        ) from None


def compare_data_parallel(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    configs: dict[str, TrainConfig],
    world_size: int,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    backend: str = "gloo",
    deadline: float | None = DEFAULT_DEADLINE_S,
    step: Step = sgd_step,
) -> dict[str, list[History]]:
    """Several runs in one launch of ``world_size`` processes: {name: results by rank}.

    Starting processes costs seconds; training a small model costs less, so the
    notebook compares all-reduce variants inside one launch (08). ``backend="gloo"``
    keeps every rank on the CPU, where the single-process reference runs too;
    ``"nccl"`` puts rank r on ``cuda:r`` (one GPU per rank). ``timeout`` bounds each
    collective and ``deadline`` the whole launch, in seconds (see
    :func:`multigpu.runtime.launch.spawn`). ``step`` does each training step on every
    rank: :func:`multigpu.allreduce_sgd.sgd_step`, or a function with its signature
    from an importable module.
    """
    for config in configs.values():  # fail here, before any process starts
        per_rank_batch_size(config.batch_size, world_size)
    check_step_importable(step)
    per_rank = spawn(
        train_rank,
        world_size,
        model,
        X,
        y,
        configs,
        step,
        backend=backend,
        timeout=timeout,
        deadline=deadline,
    )
    return {name: [results[name] for results in per_rank] for name in configs}


def train_data_parallel(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    backend: str = "gloo",
    deadline: float | None = DEFAULT_DEADLINE_S,
    step: Step = sgd_step,
) -> list[History]:
    """Train on ``world_size`` processes; one History per rank, by rank (08).

    X (N, ...) and y (N,) are the whole training set; every rank starts from a copy
    of ``model`` (which is not changed) and trains on its own shard of each batch.
    ``timeout``, ``backend``, ``deadline`` and ``step``: as in
    :func:`compare_data_parallel`.
    """
    runs = compare_data_parallel(
        model, X, y, {"run": config}, world_size, timeout, backend, deadline, step
    )
    return runs["run"]
