"""The checkers of notebook 13's exercises: a ZeRO-2 step (:func:`check_zero2_step`)
and a rank function that shards with FSDP2 and saves and loads with DCP
(:func:`check_fsdp2_rank`), each run on ranks against one process (13)."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from multigpu.collectives import ring_chunk_sizes
from multigpu.core.checks import check_positive_int
from multigpu.core.sharding import run_batches
from multigpu.core.train import TrainConfig, cpu_state_dict
from multigpu.costmodel import zero_bytes_sent_per_rank
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.ranks.zero import fsdp2_exercise_rank, stages_rank
from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from multigpu.zero import ShardedStep, train_single_process_adam

FSDP2RankFunction = Callable[..., object]
"""The learner's ``rank_function(rank, world_size, model, fresh, X, y, config,
checkpoint_dir)`` of 13's exercise 3 (its result is not used)."""

_MESH_MISSING = "fully_shard was called without mesh="

_NO_DCP_CHECKPOINT = (
    "FAIL: the folder holds no DCP checkpoint (no .metadata file). torch.save on "
    "rank 0 writes only rank 0's shard; every rank must call "
    "dcp.save({'model': model.state_dict()}, checkpoint_id=checkpoint_dir), which "
    "writes one file per rank and the .metadata that maps them."
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
    if any(not torch.equal(flat, flats[0]) for flat in flats):
        chunks = [flat.tensor_split(world_size) for flat in flats]
        initial = start.tensor_split(world_size)
        if all(
            torch.equal(chunks[rank][other], initial[other])
            for rank in range(world_size)
            for other in range(world_size)
            if other != rank
        ):
            return (
                "FAIL: after {steps} steps each rank has moved only its own chunk: "
                "the other ranks' chunks never reach it. After optimizer.step(), "
                "all-gather the updated chunks into flat: "
                "sent += all_gather(flat, shard.detach())."
            )
        return (
            "FAIL: after {steps} steps the ranks hold different weights: each rank "
            "takes the other ranks' chunks before they are updated. All-gather after "
            "optimizer.step(), not before it."
        )
    undivided = _undivided_reference(model, X, y, config, world_size)
    if _distance(trained[0], undivided) <= tolerance:
        return (
            "FAIL: after {steps} steps the weights are {distance:.1e} away from one "
            "process: they are what the sum of the ranks' gradients trains. "
            "reduce_scatter sums; divide shard.grad by the world size to get the "
            "mean."
        )
    return (
        "FAIL: after {steps} steps the weights are {distance:.1e} away from one "
        "process on the global batch. Reduce-scatter the flat gradient into "
        "shard.grad, divide it by the world size, call optimizer.step(), then "
        "all-gather shard into flat."
    )


def check_zero2_step(
    step: ShardedStep,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
    tolerance: float = 1e-10,
) -> tuple[bool, str]:
    """Does ``step`` (ZeRO-2's signature, from an importable module) train like one
    process on the global batch, keep only its chunk of the gradient and send what
    a reduce-scatter and an all-gather send? (passed, what to fix) (13)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(step, "step")
    reference = train_single_process_adam(model, X, y, config)
    steps = len(reference.step_loss)
    try:
        results = spawn(
            stages_rank,
            world_size,
            [("ZeRO-2", model, X, y, config)],
            step,
            timeout=60,
        )
    except WorkerError as error:
        return False, f"FAIL: your step raised an error: {last_line(error)}"
    results = [per_rank[0] for per_rank in results]
    distance = max(_distance(r.parameters, reference.parameters) for r in results)
    if distance > tolerance:
        return False, _diagnose_zero2_weights(
            model, X, y, config, [r.parameters for r in results], tolerance
        ).format(steps=steps, distance=distance)
    numel = sum(value.numel() for value in reference.parameters.values())
    element_size = X.element_size()
    for rank, result in enumerate(results):
        expected = zero_bytes_sent_per_rank(
            "ZeRO-2", [numel], element_size, world_size, rank
        )
        if result.bytes_sent != [expected] * steps:
            return False, (
                f"FAIL: the weights are right, but rank {rank} reported sending "
                f"{result.bytes_sent[0]} bytes per step, not the {expected} of "
                "one reduce-scatter and one all-gather. Return the sum of the byte "
                "counts that reduce_scatter and all_gather return."
            )
        kept = result.ledger["gradients"]
        chunk = ring_chunk_sizes(numel, world_size)[rank] * element_size
        if kept != chunk:
            return False, (
                f"FAIL: the weights are right, but rank {rank} keeps {kept} bytes of "
                f"gradient instead of its chunk's {chunk}. Give shard.grad a tensor "
                "of its own (torch.empty_like(shard)), not a view of the full "
                "gradient."
            )
    return True, (
        f"PASS: on {world_size} ranks your step trains like one process (weights "
        f"within {tolerance:.0e} after {steps} steps), keeps only its chunk "
        "of the gradient and sends what ZeRO-2 sends."
    )


def _diagnose_error(error: WorkerError, checkpoint_dir: Path) -> str:
    text = f"{error}\n{error.traceback}"
    if _MESH_MISSING in text:
        return (
            "FAIL: fully_shard was called without mesh=, so PyTorch picks a mesh "
            "itself: on a machine with a GPU a CUDA mesh, which moves the model to "
            "the GPU even though the ranks use gloo. Build "
            "mesh = init_device_mesh('cpu', (world_size,)) once and pass mesh=mesh "
            "to every fully_shard call."
        )
    if not (checkpoint_dir / ".metadata").is_file():
        return _NO_DCP_CHECKPOINT
    if "Missing key in checkpoint state_dict" in text:
        return (
            "FAIL: dcp.load looked for keys the checkpoint does not have: load "
            "with the same layout you saved. If you saved "
            "{'model': model.state_dict()}, load into "
            "state = {'model': fresh.state_dict()}, then "
            "fresh.load_state_dict(state['model'])."
        )
    return f"FAIL: your rank function raised an error: {last_line(error)}"


def _diagnose_sharding(report: dict) -> str | None:
    for key in ("model", "fresh"):
        part = report[key]
        layers, root = part["layers sharded"], part["root sharded"]
        if not root and not any(layers):
            return (
                f"FAIL: {key} is not sharded: no fully_shard was applied to it. Call "
                "fully_shard(layer, mesh=mesh) on each Linear, then "
                f"fully_shard({key}, mesh=mesh)."
            )
        if not all(layers):
            return (
                f"FAIL: only the whole {key} is sharded, as one unit: every forward "
                "all-gathers all of its parameters at once. Call "
                "fully_shard(layer, mesh=mesh) on each Linear first (one all-gather "
                f"per layer), then fully_shard({key}, mesh=mesh)."
            )
        if not root:
            return (
                f"FAIL: the layers of {key} are sharded, but not {key} itself. After "
                f"the layers, call fully_shard({key}, mesh=mesh): the root unit "
                "starts the all-gathers and owns any parameter outside the layers."
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
) -> tuple[bool, str]:
    """Run ``rank_function`` (13's exercise 3, from an importable module) on
    ``world_size`` ranks: does it shard every Linear and the whole model with
    ``fully_shard`` on an explicit mesh, train like one process (as
    :func:`multigpu.ranks.zero.train_fsdp2` does), save a DCP checkpoint and load it
    back, equal, into ``fresh``? (passed, what to fix) (13)."""
    check_positive_int("world_size", world_size)
    importable_or_raise(rank_function, "rank function")
    reference = train_single_process_adam(model, X, y, config)
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
                timeout=30,
            )
        except WorkerError as error:
            return False, _diagnose_error(error, Path(folder))
        saved = (Path(folder) / ".metadata").is_file()
    for report in per_rank:  # every rank sees the same modules
        message = _diagnose_sharding(report)
        if message:
            return False, message
    if not saved:
        return False, _NO_DCP_CHECKPOINT
    for rank, report in enumerate(per_rank):
        trained = report["model"]["parameters"]
        distance = _distance(trained, reference.parameters)
        if distance > tolerance:
            return False, (
                f"FAIL: on rank {rank} the trained weights are {distance:.1e} away "
                "from one process on the global batch. Shard before you build the "
                "optimizer, and keep the training loop as given."
            )
        distance = _distance(report["fresh"]["parameters"], trained)
        if distance > tolerance:
            return False, (
                f"FAIL: on rank {rank} fresh is {distance:.1e} away from the "
                "weights you saved: the checkpoint was not loaded into it. Load with "
                "dcp.load({'model': fresh.state_dict()}, "
                "checkpoint_id=checkpoint_dir) after the save, on every rank."
            )
    return True, (
        f"PASS: on {world_size} ranks your FSDP2 model (every Linear and the whole "
        "model sharded on an explicit CPU mesh) trains like one process (within "
        f"{tolerance:.0e}), and the DCP checkpoint it saved loads back equal."
    )
