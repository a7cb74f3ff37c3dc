"""The checkers of notebook 14b's exercises: one optimizer step of gradient
accumulation with FSDP2, gradients reduced on the last micro-batch only
(:func:`check_accumulation_step`, run on ranks against one process), a model
built on the meta device, sharded, then allocated and initialised shard by shard
(:func:`check_build_sharded`), and a wrap whose step fits a per-rank memory budget
(:func:`check_wrap_within_budget`) (14b)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from multigpu.core.checks import check_positive_int
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.fsdp2 import MicroBatch, train_one_process
from multigpu.fsdp2.memory import BUDGET_SIZES, budget_model
from multigpu.ranks.fsdp2_exercises import (
    accumulation_check_rank,
    budget_check_rank,
    meta_exercise_rank,
)
from multigpu.runtime.launch import (
    CROWDED_TIMEOUT_S,
    SLOW_TIMEOUT_S,
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
) -> ExerciseResult:
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
            timeout=SLOW_TIMEOUT_S,
        )
    except WorkerError as error:
        last = (error.traceback.strip().splitlines() or [str(error)])[-1]
        return fail(f"FAIL: your step raised an error: {last}")
    result = per_rank[0]
    units = result["units"]
    if result["optimizer steps"] != count:
        every = " (one per micro-batch)" * (result["optimizer steps"] == count * micro)
        return fail(
            f"FAIL: the optimizer stepped {result['optimizer steps']} times in "
            f"{count} steps{every}, so the weights moved on parts of the batch: "
            "accumulation adds the micro-batches' gradients and steps once on "
            "their sum (look at where optimizer.step() and optimizer.zero_grad() "
            "sit)."
        )
    if result["reduce-scatters"] == 0:
        return fail(
            "FAIL: no gradient was ever reduced (0 reduce-scatters): gradient sync "
            "was still off for the last micro-batch, so the sharded gradients stayed "
            "empty and the optimizer had nothing to apply."
        )
    reference = train_one_process(model, steps, LR, optimizer="sgd")
    distance = max(_distance(r["parameters"], reference.parameters) for r in per_rank)
    if distance > tolerance:
        undivided = train_one_process(model, steps, LR * micro, optimizer="sgd")
        if _distance(result["parameters"], undivided.parameters) < tolerance:
            return fail(
                f"FAIL: the weights moved {micro} times too far: they are what the "
                f"sum of the {micro} micro-batches' mean losses trains, not the mean "
                "loss over the whole batch."
            )
        return fail(
            f"FAIL: after {count} steps the weights are {distance:.1e} away from one "
            "process on the whole batch: the gradients summed over the micro-batches "
            "are not the gradient of the mean loss over all of them."
        )
    expected = count * units
    if result["reduce-scatters"] != expected:
        every = result["reduce-scatters"] == count * micro * units
        why = (
            f"gradients were reduced after every micro-batch ({micro} per step)"
            if every
            else "gradients were reduced more often than once per step"
        )
        return fail(
            f"FAIL: the weights are right, but {why}: "
            f"{result['reduce-scatters']} reduce-scatters instead of {expected} "
            f"({units} units x {count} steps): gradient sync stayed on for the "
            "micro-batches before the last."
        )
    return ok(
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
            "the whole model before sharding it, instead of building it on the meta "
            "device, which records shapes and allocates nothing."
        )
    if not report["root sharded"] or not all(report["layers sharded"]):
        layers = report["layers sharded"]
        missing = [f"{layers.count(False)} of {len(layers)} Linear layers"] * (
            False in layers
        ) + ["the root (the whole model)"] * (not report["root sharded"])
        return (
            f"FAIL: the model is not sharded layer by layer: {' and '.join(missing)} "
            "did not become FSDP units before anything was allocated."
        )
    if False in report["to_empty sharded"]:
        return (
            "FAIL: to_empty ran before fully_shard, so it allocated the whole model on "
            "every rank; after sharding it would allocate only this rank's shards."
        )
    if report["meta parameters"]:
        return (
            f"FAIL: {report['meta parameters']} parameters are still on the meta "
            "device (no storage): nothing allocated this rank's shards after "
            "sharding."
        )
    if not all(top <= 1.0 and 0.3 < std < 0.9 for top, std in report["spreads"]):
        return (
            "FAIL: the shards hold uninitialised memory: to_empty allocates without "
            "filling, and no layer initialised its parameters after it (look at "
            "reset_parameters)."
        )
    return None


def check_build_sharded(
    build_function: MetaBuildFunction, world_size: int = 2
) -> ExerciseResult:
    """Run the learner's ``build_function(build, mesh)`` (from an importable module)
    on ``world_size`` ranks: does it build on the meta device, shard every Linear
    and the whole model, allocate only this rank's shards (``to_empty`` after
    ``fully_shard``) and initialise them? (passed, what to fix) (14b)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(build_function, "build function")
    try:
        per_rank = spawn(
            meta_exercise_rank,
            world_size,
            build_function,
            META_SIZES,
            timeout=SLOW_TIMEOUT_S,
        )
    except WorkerError as error:
        last = (error.traceback.strip().splitlines() or [str(error)])[-1]
        return fail(f"FAIL: your build function raised an error: {last}")
    for report in per_rank:
        message = _diagnose_meta(report)
        if message:
            return fail(message)
    stored, whole = per_rank[0]["stored bytes"], per_rank[0]["whole bytes"]
    return ok(
        f"PASS: on {world_size} ranks the model was built on the meta device, "
        f"sharded layer by layer, and each rank allocated {stored:,} of its "
        f"{whole:,} bytes and initialised them with reset_parameters."
    )


WrapFunction = Callable[..., nn.Module]
"""The learner's ``wrap(model, mesh)`` of 14b's exercise 3: the model sharded over
``mesh`` so that one training step fits :data:`BUDGET_BYTES` on every rank."""

BUDGET_BYTES = 950_000  # per rank, at the peak of a step: bf16, resharding and AC fit
BUDGET_RANKS = 4
BUDGET_LR = 0.1  # plain SGD: the difference measures rounding, as in section 3
BF16_TOLERANCE = 3e-4  # bf16 compute, fp32 master and reductions: 3e-5 measured
FP32_TOLERANCE = 1e-5  # float32 throughout: 1.5e-8 measured


def budget_batches(steps: int = 2, samples: int = 512, seed: int = 1) -> list:
    """The global batches of exercise 3: ``steps`` (inputs, labels) pairs of
    ``samples`` rows of the budget model's inputs, 10 classes (14b)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(samples, BUDGET_SIZES[0], generator=generator),
            torch.randint(0, BUDGET_SIZES[-1], (samples,), generator=generator),
        )
        for _ in range(steps)
    ]


def _not_sharded(report: dict) -> str:
    blocks = sum(report["blocks per unit"])
    if not report["units"]:
        return (
            "FAIL: nothing was sharded: every rank holds the whole model, its "
            "gradients and its activations, and no gradient is averaged across the "
            "ranks."
        )
    return (
        f"FAIL: the model itself (the root) is not sharded, only {report['units']} "
        f"units inside it ({blocks} of {BUDGET_SIZES[2]} blocks): the layers outside "
        "them (the first and the last Linear) stay whole on every rank, and their "
        "gradients are never averaged across the ranks."
    )


def _over_budget(rank: int, report: dict) -> str:
    peak = report["peak"]
    kinds = sorted(
        ((k, v) for k, v in peak.items() if k != "total"), key=lambda kv: -kv[1]
    )
    held = ", ".join(f"{kind} {nbytes:,}" for kind, nbytes in kinds)
    causes = []
    if "float32" in report["gather dtypes"]:
        causes.append("the parameters were all-gathered and computed in float32")
    if report["units kept after forward"]:
        causes.append(
            f"{report['units kept after forward']} units kept their all-gathered "
            "parameters from forward to backward"
        )
    if report["units kept on fewer ranks"]:
        causes.append(
            f"{report['units kept on fewer ranks']} units kept their parameters "
            "sharded over fewer ranks from forward to backward"
        )
    if report["blocks saved whole"]:
        causes.append(
            f"{report['blocks saved whole']} of {BUDGET_SIZES[2]} blocks saved their "
            "inside for backward instead of recomputing it"
        )
    if not any(report["blocks per unit"]):
        causes.append("no block is a unit of its own, so all of them are gathered")
    why = f" Here {'; '.join(causes)}." if causes else ""
    return (
        f"FAIL: rank {rank}'s peak was {peak['total']:,} bytes, over the budget of "
        f"{BUDGET_BYTES:,}. At the peak it held: {held}.{why}"
    )


def _diagnose_budget(per_rank: list[dict], tolerance: float) -> str | None:
    report = per_rank[0]
    if report["master dtypes"] != ["float32"]:
        return (
            f"FAIL: the sharded parameters the optimizer updates are "
            f"{', '.join(report['master dtypes'])}, not float32: bf16 is for "
            "computing, and a bf16 master copy loses every update smaller than its "
            f"spacing (the weights end {report['distance']:.1e} from one float32 "
            "process)."
        )
    if report["frozen"]:
        return (
            f"FAIL: {report['frozen']} parameters no longer require gradients: "
            "freezing them saves their gradients' memory, but they stop training, "
            f"so the weights end {report['distance']:.1e} from one float32 process."
        )
    if report["changed by wrap"]:
        return (
            "FAIL: the weights changed inside your wrap, before any training: it "
            "must shard the model it is given, not rebuild or re-initialise it."
        )
    if report["distance"] > tolerance:
        return (
            f"FAIL: after 2 steps the weights are {report['distance']:.1e} from one "
            f"float32 process, more than the {tolerance:.0e} that bf16 computation "
            "with float32 master weights and float32 reductions stays within: the "
            "precision policy changes the results too much."
        )
    for rank, result in enumerate(per_rank):
        if result["peak"]["total"] > BUDGET_BYTES:
            return _over_budget(rank, result)
    return None


def check_wrap_within_budget(
    wrap_function: WrapFunction, world_size: int = BUDGET_RANKS
) -> ExerciseResult:
    """Run the learner's ``wrap_function(model, mesh)`` (from an importable module)
    on ``world_size`` ranks: 2 SGD steps of the budget model under PyTorch's
    ``FSDPMemTracker``. Is every rank's peak within :data:`BUDGET_BYTES`, are the
    weights within tolerance of one float32 process, is the root sharded?
    (passed, what is wrong) (14b)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(wrap_function, "wrap function")
    batches = budget_batches()
    try:
        per_rank = spawn(
            budget_check_rank,
            world_size,
            wrap_function,
            BUDGET_SIZES,
            batches,
            BUDGET_LR,
            timeout=CROWDED_TIMEOUT_S,
        )
    except WorkerError as error:
        return fail(
            "FAIL: your wrap, or a training step of the model it returned, raised "
            f"an error: {last_line(error)}"
        )
    report = per_rank[0]
    if report["returned"] == "not a module":
        return fail(
            f"FAIL: wrap returned {report['type']}, not the model: the checker "
            "trains what wrap returns."
        )
    if report["returned"] == "not sharded":
        return fail(_not_sharded(report))
    steps = [[batch] for batch in batches]
    reference = train_one_process(budget_model(), steps, BUDGET_LR, optimizer="sgd")
    for result in per_rank:
        result["distance"] = _distance(result["parameters"], reference.parameters)
    fp32 = report["gather dtypes"] == ["float32"]
    tolerance = FP32_TOLERANCE if fp32 else BF16_TOLERANCE
    message = _diagnose_budget(per_rank, tolerance)
    if message:
        return fail(message)
    peak = max(r["peak"]["total"] for r in per_rank)
    return ok(
        f"PASS: on {world_size} ranks every rank's peak was at most {peak:,} bytes, "
        f"within the budget of {BUDGET_BYTES:,}, and after 2 steps the weights are "
        f"within {tolerance:.0e} of one float32 process."
    )
