"""The checker of notebook 10's exercise, where the learner writes a bucketed DDP
(10)."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.allreduce_sgd import train_one_process
from multigpu.core.compare import max_parameter_difference
from multigpu.core.train import TrainConfig
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.miniddp import BucketedDDP
from multigpu.ranks.miniddp import probe_rank
from multigpu.runtime.launch import SLOW_TIMEOUT_S, WorkerError, spawn

ASKED_FOR = ("gradient_ready", "synchronize")  # what the exercise asks the learner for


def not_written(wrapper: type) -> str | None:
    """Why ``wrapper`` would run :class:`BucketedDDP`'s own ``gradient_ready`` or
    ``synchronize`` instead of the learner's (a FAIL message), or None (10)."""
    name = wrapper.__name__
    missing = [m for m in ASKED_FOR if getattr(wrapper, m) is getattr(BucketedDDP, m)]
    if missing:
        return (
            f"FAIL: {name} does not define {' and '.join(missing)}, so it runs "
            f"BucketedDDP's own, the answer, and this check would test that instead "
            f"of your code. Write {' and '.join(missing)} in {name}'s class body."
        )
    for method in ASKED_FOR:
        code = getattr(getattr(wrapper, method), "__code__", None)
        names = code.co_names if code is not None else ()
        if "super" in names or method in names:
            return (
                f"FAIL: {name}.{method} calls BucketedDDP's own {method} (through "
                f"super() or BucketedDDP.{method}), the answer, instead of doing the "
                "work itself. Write its body with the bucket's fields."
            )
    return None


def check_wrapper(
    wrapper: type,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
) -> ExerciseResult:
    """Does ``wrapper``, a subclass of :class:`~multigpu.miniddp.BucketedDDP` with its
    own ``gradient_ready`` and ``synchronize``, train like one process on the global
    batch, and start each bucket's all-reduce during backward? (passed, what to
    fix) (10). ``wrapper`` must live in a module the ranks can import (a
    ``%%module`` cell). A class that leaves either method to BucketedDDP's own
    (inherited, or called through ``super()``) fails before any rank starts; an
    exception on a rank fails with what to fix."""
    if not (isinstance(wrapper, type) and issubclass(wrapper, BucketedDDP)):
        raise TypeError(
            f"check_wrapper needs a subclass of BucketedDDP, got {wrapper!r}. Write "
            "`class MyDDP(BucketedDDP):` in a %%module cell and import it."
        )
    if wrapper.__module__ in ("__main__", "__mp_main__"):
        raise TypeError(
            f"{wrapper.__name__} is defined in the notebook, so the ranks cannot "
            "import it. Write it in a %%module cell and import it from there."
        )
    failure = not_written(wrapper)
    if failure:
        return fail(failure)
    reference = train_one_process(model, X, y, config)
    try:
        results = spawn(
            probe_rank, world_size, wrapper, model, X, y, config, timeout=SLOW_TIMEOUT_S
        )
    except WorkerError as error:
        return fail(rank_failure(error))
    first = results[0]
    if any(result["blocking"] for result in results):
        return fail(
            "FAIL: gradient_ready ran its all-reduces synchronously, inside the "
            "hook: each call waited for the sum and returned no Work (bucket.work "
            "stayed None), so backward stood still while a bucket travelled and "
            "nothing overlapped."
        )
    if any(
        max_parameter_difference(r["run"].parameters, first["run"].parameters) > 0
        for r in results[1:]
    ):
        return fail(
            f"FAIL: the {world_size} ranks ended with different weights: each "
            "stepped with its own gradient, so the averaged buckets never reached "
            "the parameters' .grad."
        )
    distance = max_parameter_difference(first["run"].parameters, reference.parameters)
    if distance > 1e-9:
        return fail(
            f"FAIL: the ranks agree, but end {distance:.1e} away from one process on "
            "the global batch: the all-reduce sums the ranks' gradients, and their "
            "mean needs a division by the world size, exactly once."
        )
    started = first["started"]
    if first["buckets"] > 1 and (len(started) < 2 or started[-2] == 0):
        return fail(
            "FAIL: the weights are right, but no all-reduce had started before "
            "backward computed its last gradient, so nothing overlapped: every "
            "bucket was sent after backward had ended."
        )
    return ok(
        f"PASS: {wrapper.__name__} trains like one process on the global batch on "
        f"{world_size} ranks, and sent {started[-2]} of {first['buckets']} buckets "
        "before backward ended."
    )


def rank_failure(error: WorkerError) -> str:
    """A FAIL message for a learner's class that raised on a rank; a launch that
    failed otherwise (a rank died) re-raises (10)."""
    if not error.traceback or error.exitcode is not None:
        raise error
    if "'NoneType' object has no attribute 'wait'" in error.traceback:
        return (
            "FAIL: synchronize found a bucket whose all-reduce was never started "
            "(bucket.work is None): the bucket never counted as full, because "
            "bucket.waiting never emptied, or its Work was not kept."
        )
    last = error.traceback.strip().splitlines()[-1]
    return f"FAIL: your class raised on rank {error.rank}: {last}."
