"""The checkers of notebook 13's exercises: a ZeRO-2 step written with PyTorch's
collectives, which need equal chunks (:func:`check_zero2_step`), and a rank function
that shards with FSDP2 and saves and loads with DCP (:func:`check_fsdp2_rank`), each
run on ranks against one process (13)."""

from __future__ import annotations

import copy
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.core.batches import run_batches
from multigpu.core.checks import check_positive_int
from multigpu.core.train import TrainConfig, cpu_state_dict
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.zero import chunk_range, fsdp2_exercise_rank, zero2_exercise_rank
from multigpu.runtime.launch import (
    DEFAULT_TIMEOUT_S,
    WorkerError,
    spawn,
)
from multigpu.zero import train_one_process_adam

Zero2Step = Callable[..., object]
"""The learner's ``step(model, flat, shard, optimizer, X, y)`` of 13's exercise 1:
one ZeRO-2 step on this rank's batch, ``shard`` this rank's ``torch.chunk`` piece of
the flat buffer ``flat``; it returns the rank's loss (not used)."""

FSDP2RankFunction = Callable[..., object]
"""The learner's ``rank_function(rank, world_size, model, fresh, X, y, config,
checkpoint_dir)`` of 13's exercise 3 (its result is not used)."""

_MESH_MISSING = "fully_shard was called without mesh="

_NO_DCP_CHECKPOINT = (
    "FAIL: the folder holds no DCP checkpoint (no .metadata file). torch.save on "
    "rank 0 writes only rank 0's shard of a sharded model; a DCP checkpoint is "
    "written by every rank together (dcp.save), each its own rows, with the "
    ".metadata file that maps them."
)

_UNEQUAL = re.compile(
    r"worldSize == inputShape|invalid tensor size|must be (divisible|equal)|"
    r"equal size|split_size",
    re.IGNORECASE,
)


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in b)


def _flat(parameters: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([parameters[name].reshape(-1) for name in names])


def _undivided_reference(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, config: TrainConfig, n: int
) -> dict[str, torch.Tensor]:
    """One process on the global batch with the loss times ``n``: the sum of the
    ranks' mean gradients, what a step that forgets to divide by n trains."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    for indices in run_batches(len(X), config, 1, 0)[0]:
        optimizer.zero_grad()
        (F.cross_entropy(model(X[indices]), y[indices]) * n).backward()
        optimizer.step()
    return cpu_state_dict(model)


def _diagnose_zero2_weights(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    trained: list[dict[str, torch.Tensor]],
    tolerance: float,
) -> str:
    """The FAIL message (with {steps} and {distance} to fill) for a ZeRO-2 step
    whose weights are not one process's: which mistake explains them."""
    world_size = len(trained)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    start = _flat(dict(model.named_parameters()), names).detach()
    flats = [_flat(parameters, names) for parameters in trained]
    owned = [chunk_range(len(start), world_size, rank) for rank in range(world_size)]
    if all(torch.equal(flat, start) for flat in flats):
        return (
            "FAIL: after {steps} steps no weight has moved: the optimizer never "
            "updated the shard (it steps only on a gradient that shard.grad holds), "
            "or the updated chunks never reached flat."
        )
    if any(not torch.equal(flat, flats[0]) for flat in flats):
        if all(
            torch.equal(
                flats[rank][part.start : part.stop], start[part.start : part.stop]
            )
            for rank in range(world_size)
            for other, part in enumerate(owned)
            if other != rank
        ):
            return (
                "FAIL: after {steps} steps each rank has moved only its own chunk: "
                "the other ranks' updated chunks never reach its flat buffer, which "
                "the model's parameters are views of. That is the all-gather's job, "
                "after the optimizer's step."
            )
        return (
            "FAIL: after {steps} steps the ranks hold different weights: each rank "
            "takes the other ranks' chunks before they are updated. The all-gather "
            "belongs after the optimizer's step."
        )
    undivided = _undivided_reference(model, X, y, config, world_size)
    if _distance(trained[0], undivided) <= tolerance:
        return (
            "FAIL: after {steps} steps the weights are {distance:.1e} away from one "
            "process: they are what the sum of the ranks' gradients trains. A "
            "reduce-scatter sums; each rank's loss is a mean over its own batch, so "
            "the gradient Adam sees must be the mean over the ranks."
        )
    return (
        "FAIL: after {steps} steps the ranks agree, but the weights are "
        "{distance:.1e} away from one process on the global batch: a rank's shard "
        "was updated with a gradient other than its own chunk's (check where the "
        "padding goes and which elements of the reduce-scatter's result are this "
        "rank's)."
    )


def _diagnose_step_error(error: WorkerError, world_size: int, numel: int) -> str:
    text = f"{error}\n{error.traceback}"
    if error.timed_out:
        return (
            "FAIL: the ranks waited for each other until the timeout: a collective "
            "ran on some ranks and not on the others. Every rank must call the same "
            "collectives, in the same order, in every step."
        )
    if "assign a gradient of size" in text or "grad has data of a different" in text:
        return (
            "FAIL: shard.grad got a tensor of another size than the shard: it must "
            "hold the gradient of this rank's own elements only, without the "
            f"padding. ({last_line(error)})"
        )
    if _UNEQUAL.search(text):
        said = re.sub(r"\[rank\d+\]:\[[^\]]*\] ", "", last_line(error))  # no stamp
        return (
            "FAIL: a collective refused tensors of unequal sizes: PyTorch's "
            "reduce-scatter and all-gather move world_size equal chunks, and "
            f"{numel:,} parameters do not divide by {world_size}. Pad to a multiple "
            "of the world size, and leave the padding out of the shard. "
            f"({said})"
        )
    return f"FAIL: your step raised an error: {last_line(error)}"


def check_zero2_step(
    step: Zero2Step,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 4,
    tolerance: float = 1e-10,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> ExerciseResult:
    """Does ``step`` (13's exercise 1, from an importable module) train like one
    process on the global batch on ``world_size`` ranks, each owning its
    ``torch.chunk`` piece of the flat buffer, with a reduce-scatter rather than an
    all-reduce, keeping only its chunk of the gradient? (passed, what is wrong)
    (13). ``timeout``: seconds a rank waits in a collective before the check names
    a deadlock."""
    check_positive_int("world_size", world_size)
    importable_or_raise(step, "step")
    reference = train_one_process_adam(model, X, y, config)
    steps = len(reference.step_loss)
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    try:
        results = spawn(
            zero2_exercise_rank, world_size, step, model, X, y, config, timeout=timeout
        )
    except WorkerError as error:
        return fail(_diagnose_step_error(error, world_size, numel))
    distance = max(_distance(r["parameters"], reference.parameters) for r in results)
    if distance > tolerance:
        return fail(
            _diagnose_zero2_weights(
                model, X, y, config, [r["parameters"] for r in results], tolerance
            ).format(steps=steps, distance=distance)
        )
    for rank, result in enumerate(results):
        if result["calls"].get("all_reduce"):
            return fail(
                "FAIL: the weights are right, but your step all-reduces: every rank "
                "receives the whole summed gradient and then uses only its chunk, "
                "which is ZeRO-1's traffic and memory. In ZeRO-2 a rank receives "
                "only its own chunk of the sum."
            )
        kept, chunk = result["gradient bytes"], result["chunk bytes"]
        if kept > chunk:
            return fail(
                f"FAIL: the weights are right, but rank {rank}'s shard.grad keeps "
                f"{kept:,} bytes of gradient alive instead of at most its chunk's "
                f"{chunk:,}: it is a view into a larger tensor, which stays in "
                "memory as long as the view does."
            )
    return ok(
        f"PASS: on {world_size} ranks your step trains like one process (weights "
        f"within {tolerance:.0e} after {steps} steps), pads {numel:,} parameters to "
        f"{world_size} equal chunks, reduce-scatters the gradient and keeps only its "
        "chunk of it."
    )


def _diagnose_error(error: WorkerError, checkpoint_dir: Path) -> str:
    text = f"{error}\n{error.traceback}"
    if _MESH_MISSING in text:
        return (
            "FAIL: fully_shard was called without a mesh, so PyTorch picks one "
            "itself: on a machine with a GPU a CUDA mesh, which moves the model to "
            "the GPU even though the ranks use gloo. Every fully_shard call needs "
            "the same explicit CPU mesh of all the ranks (init_device_mesh)."
        )
    if not (checkpoint_dir / ".metadata").is_file():
        return _NO_DCP_CHECKPOINT
    if "Missing key in checkpoint state_dict" in text:
        return (
            "FAIL: dcp.load looked for keys the checkpoint does not have: the "
            "dictionary you load into must have the layout of the one you saved "
            "(the same outer keys), and fresh then takes its part back with "
            "load_state_dict."
        )
    return f"FAIL: your rank function raised an error: {last_line(error)}"


def _diagnose_sharding(report: dict) -> str | None:
    for key in ("model", "fresh"):
        part = report[key]
        layers, root = part["layers sharded"], part["root sharded"]
        if not root and not any(layers):
            return (
                f"FAIL: {key} is not sharded: no fully_shard was applied to it or to "
                "any of its layers, so every rank keeps the whole model (plain data "
                "parallelism, without even the gradient averaging)."
            )
        if not all(layers):
            return (
                f"FAIL: only the whole {key} is sharded, as one unit: every forward "
                "all-gathers all of its parameters at once, so the whole model is "
                "in memory together. ZeRO-3 gathers one layer at a time: each "
                "Linear must be a unit of its own, sharded before the whole."
            )
        if not root:
            return (
                f"FAIL: the layers of {key} are sharded, but not {key} itself: "
                "without a root unit nothing starts the all-gathers for the whole "
                "forward, and a parameter outside the layers stays unsharded."
            )
    return None


def check_fsdp2_rank(
    rank_function: FSDP2RankFunction,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
    tolerance: float = 1e-10,
) -> ExerciseResult:
    """Run ``rank_function`` (13's exercise 3, from an importable module) on
    ``world_size`` ranks: does it shard every Linear and the whole model with
    ``fully_shard`` on an explicit mesh, train like one process (as
    :func:`multigpu.ranks.zero.train_fsdp2` does), save a DCP checkpoint and load it
    back, equal, into ``fresh``? (passed, what to fix) (13)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(rank_function, "rank function")
    reference = train_one_process_adam(model, X, y, config)
    fresh = copy.deepcopy(model)
    with torch.no_grad():  # weights unlike the trained ones: a load must show
        for parameter in fresh.parameters():
            parameter.mul_(-1.0).add_(0.5)
    with tempfile.TemporaryDirectory() as folder:
        try:
            per_rank = spawn(
                fsdp2_exercise_rank,
                world_size,
                rank_function,
                model,
                fresh,
                X,
                y,
                config,
                folder,
            )
        except WorkerError as error:
            return fail(_diagnose_error(error, Path(folder)))
        saved = (Path(folder) / ".metadata").is_file()
    for report in per_rank:  # every rank sees the same modules
        message = _diagnose_sharding(report)
        if message:
            return fail(message)
    if not saved:
        return fail(_NO_DCP_CHECKPOINT)
    for rank, report in enumerate(per_rank):
        trained = report["model"]["parameters"]
        distance = _distance(trained, reference.parameters)
        if distance > tolerance:
            return fail(
                f"FAIL: on rank {rank} the trained weights are {distance:.1e} away "
                "from one process on the global batch: the optimizer did not train "
                "the sharded parameters as given (an optimizer built before "
                "sharding holds the old, unsharded ones), or the loop changed."
            )
        distance = _distance(report["fresh"]["parameters"], trained)
        if distance > tolerance:
            return fail(
                f"FAIL: on rank {rank} fresh is {distance:.1e} away from the "
                "weights you saved: the checkpoint never reached it. dcp.load runs "
                "on every rank, after the save, and fills the sharded state dict of "
                "fresh in place."
            )
    return ok(
        f"PASS: on {world_size} ranks your FSDP2 model (every Linear and the whole "
        "model sharded on an explicit CPU mesh) trains like one process (within "
        f"{tolerance:.0e}), and the DCP checkpoint it saved loads back equal."
    )
