"""The checkers of notebook 14b's exercises: one optimizer step of gradient
accumulation with FSDP2, gradients reduced on the last micro-batch only
(:func:`check_accumulation_step`, run on ranks against one process), and a model
built on the meta device, sharded, then allocated and initialised shard by shard
(:func:`check_build_sharded`) (14b)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from multigpu.core.checks import check_positive_int
from multigpu.exercises._learner_code import importable_or_raise
from multigpu.fsdp2 import MicroBatch, train_one_process
from multigpu.ranks.fsdp2 import accumulation_check_rank, meta_exercise_rank
from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from multigpu.zero import make_mlp

AccumulationStep = Callable[..., object]
"""The learner's ``accumulation_step(model, optimizer, micro_batches)``: one
optimizer step over this rank's micro-batches, each an (inputs, labels) pair."""

LR = 0.5  # plain SGD: a gradient k times too large moves the weights k times as far


def accumulation_problem(
    steps: int = 2, micro_batches: int = 3, samples: int = 6, seed: int = 0
) -> tuple[nn.Module, list[list[MicroBatch]]]:
    """The checker's model (an MLP 6 -> 8 -> 8 -> 3, float64, 3 units) and its
    global steps: ``steps`` lists of ``micro_batches`` (inputs, labels) pairs of
    ``samples`` each (14b)."""
    torch.manual_seed(seed)
    model = make_mlp((6, 8, 8, 3))
    generator = torch.Generator().manual_seed(seed + 1)
    total = steps * micro_batches * samples
    X = torch.randn(total, 6, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (total,), generator=generator)
    pairs = list(zip(X.split(samples), y.split(samples)))
    return model, [
        pairs[i * micro_batches : (i + 1) * micro_batches] for i in range(steps)
    ]


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in b)


def check_accumulation_step(
    step_function: AccumulationStep,
    world_size: int = 2,
    tolerance: float = 1e-12,
) -> tuple[bool, str]:
    """Run the learner's ``step_function(model, optimizer, micro_batches)`` (from
    an importable module) on ``world_size`` ranks, FSDP2 and plain SGD, for 2 steps
    of 3 micro-batches: does it train like one process on the whole batch, reduce
    the gradients once per step and call the optimizer once per step? (passed,
    what to fix) (14b)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(step_function, "step function")
    model, steps = accumulation_problem()
    count, micro = len(steps), len(steps[0])
    try:
        per_rank = spawn(
            accumulation_check_rank,
            world_size,
            step_function,
            model,
            steps,
            LR,
            timeout=60,
        )
    except WorkerError as error:
        last = (error.traceback.strip().splitlines() or [str(error)])[-1]
        return False, f"FAIL: your step raised an error: {last}"
    result = per_rank[0]
    units = result["units"]
    if result["optimizer steps"] != count:
        every = " (one per micro-batch)" * (result["optimizer steps"] == count * micro)
        return False, (
            f"FAIL: the optimizer stepped {result['optimizer steps']} times in "
            f"{count} steps{every}. Accumulate: call optimizer.step() and "
            "optimizer.zero_grad() once, after the last micro-batch's backward."
        )
    if result["reduce-scatters"] == 0:
        return False, (
            "FAIL: no gradient was ever reduced (0 reduce-scatters), so the "
            "sharded gradients stayed empty and the optimizer had nothing to apply. "
            "Call model.set_requires_gradient_sync(True) before the last "
            "micro-batch's forward and backward."
        )
    reference = train_one_process(model, steps, LR, optimizer="sgd")
    distance = max(_distance(r["parameters"], reference.parameters) for r in per_rank)
    if distance > tolerance:
        undivided = train_one_process(model, steps, LR * micro, optimizer="sgd")
        if _distance(result["parameters"], undivided.parameters) < tolerance:
            return False, (
                f"FAIL: the weights moved {micro} times too far: they are what the "
                f"sum of the {micro} micro-batches' mean losses trains. Divide each "
                f"micro-batch's loss by the number of micro-batches "
                "(len(micro_batches)) before backward."
            )
        return False, (
            f"FAIL: after {count} steps the weights are {distance:.1e} away from one "
            "process on the whole batch. Run forward and backward on every "
            "micro-batch, each loss divided by len(micro_batches), then step."
        )
    expected = count * units
    if result["reduce-scatters"] != expected:
        every = result["reduce-scatters"] == count * micro * units
        why = (
            f"gradients were reduced after every micro-batch ({micro} per step)"
            if every
            else "gradients were reduced more often than once per step"
        )
        return False, (
            f"FAIL: the weights are right, but {why}: "
            f"{result['reduce-scatters']} reduce-scatters instead of {expected} "
            f"({units} units x {count} steps). Call "
            "model.set_requires_gradient_sync(False) before each micro-batch but "
            "the last, and True before the last."
        )
    return True, (
        f"PASS: on {world_size} ranks your step trains like one process on the whole "
        f"batch (within {tolerance:.0e}), with {expected} reduce-scatters ({units} "
        f"units x {count} steps, one per unit per step) and one optimizer step per "
        "step."
    )


MetaBuildFunction = Callable[..., nn.Module]
"""The learner's ``build_sharded(build, mesh)`` of 14b's exercise 2: the model
``build()`` makes, sharded over ``mesh``, with only this rank's shards allocated
and initialised."""

META_SIZES = (64, 256, 256, 8)  # 84,744 parameters: 339 kB in float32


def _diagnose_meta(report: dict) -> str | None:
    if report["built on"] != ["meta"]:
        where = (
            report["built on"][0] if report["built on"] else "nowhere (never called)"
        )
        return (
            f"FAIL: build() created the parameters on {where}: every rank allocated "
            "the whole model before sharding it. Call build() inside "
            "`with torch.device('meta'):`, which records shapes and allocates nothing."
        )
    if not report["root sharded"] or not all(report["layers sharded"]):
        return (
            "FAIL: the model is not sharded layer by layer. Call "
            "fully_shard(layer, mesh=mesh) on each nn.Linear, then "
            "fully_shard(model, mesh=mesh), before allocating anything."
        )
    if False in report["to_empty sharded"]:
        return (
            "FAIL: to_empty ran before fully_shard, so it allocated the whole model on "
            "every rank. Shard first, then call model.to_empty(device='cpu'): it then "
            "allocates only this rank's shards."
        )
    if report["meta parameters"]:
        return (
            f"FAIL: {report['meta parameters']} parameters are still on the meta "
            "device (no storage). After sharding, call model.to_empty(device='cpu')."
        )
    if not all(top <= 1.0 and 0.3 < std < 0.9 for top, std in report["spreads"]):
        return (
            "FAIL: the shards hold uninitialised memory: to_empty allocates without "
            "filling. Call reset_parameters() on every module that has it, after "
            "to_empty."
        )
    return None


def check_build_sharded(
    build_function: MetaBuildFunction, world_size: int = 2
) -> tuple[bool, str]:
    """Run the learner's ``build_function(build, mesh)`` (from an importable module)
    on ``world_size`` ranks: does it build on the meta device, shard every Linear
    and the whole model, allocate only this rank's shards (``to_empty`` after
    ``fully_shard``) and initialise them? (passed, what to fix) (14b)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(build_function, "build function")
    try:
        per_rank = spawn(
            meta_exercise_rank, world_size, build_function, META_SIZES, timeout=60
        )
    except WorkerError as error:
        last = (error.traceback.strip().splitlines() or [str(error)])[-1]
        return False, f"FAIL: your build function raised an error: {last}"
    for report in per_rank:
        message = _diagnose_meta(report)
        if message:
            return False, message
    stored, whole = per_rank[0]["stored bytes"], per_rank[0]["whole bytes"]
    return True, (
        f"PASS: on {world_size} ranks the model was built on the meta device, "
        f"sharded layer by layer, and each rank allocated {stored:,} of its "
        f"{whole:,} bytes and initialised them with reset_parameters."
    )
