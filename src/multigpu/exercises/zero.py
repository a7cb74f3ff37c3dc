"""The checker of notebook 13's exercise: write a ZeRO-2 step, check it against one
process (13)."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.collectives import ring_chunk_sizes
from multigpu.core.checks import check_positive_int
from multigpu.core.train import TrainConfig
from multigpu.costmodel import zero_bytes_sent_per_rank
from multigpu.ranks.zero import stages_rank
from multigpu.runtime.launch import WorkerNotImportableError, check_importable, spawn
from multigpu.zero import ShardedStep, train_single_process_adam


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
    name = getattr(step, "__qualname__", repr(step))
    try:
        check_importable(step)
    except (TypeError, WorkerNotImportableError):
        raise WorkerNotImportableError(
            f"The step {name!r} cannot be imported by the ranks. Write it in a "
            "module (in a notebook, a %%module cell), import it from there and pass "
            "the imported function."
        ) from None
    reference = train_single_process_adam(model, X, y, config)
    steps = len(reference.step_loss)
    results = spawn(
        stages_rank, world_size, [("ZeRO-2", model, X, y, config)], step, timeout=60
    )
    results = [per_rank[0] for per_rank in results]
    distance = max(
        (result.parameters[key] - value).abs().max().item()
        for result in results
        for key, value in reference.parameters.items()
    )
    if distance > tolerance:
        return False, (
            f"FAIL: after {steps} steps the weights are {distance:.1e} away "
            "from one process on the global batch. Reduce-scatter the flat gradient "
            "into shard.grad, divide it by the world size, call optimizer.step(), "
            "then all-gather shard into flat."
        )
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
