"""The checkers of notebook 09b's exercises where the learner writes DDP code: a
checkpoint saved on rank 0 and loaded on every rank, and gradient accumulation with
``no_sync`` (09b)."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable

import torch
from torch import nn

from multigpu.core.compare import max_parameter_difference
from multigpu.ranks.ddp_exercises import accumulation_probe_rank, checkpoint_probe_rank
from multigpu.runtime.launch import WorkerError, spawn


def check_checkpoint(
    save: Callable, load: Callable, world_size: int = 2, timeout: float = 10.0
) -> tuple[bool, str]:
    """Does ``save(path, model, optimizer, epoch)`` write the checkpoint on rank 0
    only, and does ``load(path, model, optimizer, device)`` wait for it and load it
    with ``map_location=device`` on every rank, returning the epoch? (passed, what
    to fix) (09b). Both must live in a module the ranks can import (``%%module``)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            ranks = spawn(
                checkpoint_probe_rank, world_size, save, load, folder, timeout=timeout
            )
        except WorkerError as error:
            if not (error.timed_out or "collective mismatch" in str(error)):
                raise
            return False, (
                "FAIL: the ranks did not call dist.barrier() together: rank 0 "
                "waited at a barrier the other ranks never reached. Call "
                "dist.barrier() on every rank, outside the `if rank == 0:` block."
            )
    if not ranks[0]["saves"]:
        return False, (
            "FAIL: rank 0 never saved. In save, when dist.get_rank() == 0, call "
            "torch.save({'model': ..., 'optimizer': ..., 'epoch': epoch}, path)."
        )
    savers = [rank for rank, report in enumerate(ranks) if rank and report["saves"]]
    if savers:
        return False, (
            f"FAIL: rank {savers[0]} saved too: every rank wrote the same file. Every "
            "rank holds the same weights, so save only when dist.get_rank() == 0."
        )
    stale = [
        r for r, report in enumerate(ranks) if not report["loaded epoch 2's weights"]
    ]
    if stale:
        return False, (
            f"FAIL: rank {stale[0]} loaded the previous checkpoint: it read the file "
            "before rank 0 had finished writing the new one. Call dist.barrier() on "
            "every rank after rank 0's torch.save and before torch.load."
        )
    if any(report["loaded epoch"] != 2 for report in ranks):
        return False, (
            "FAIL: the weights were loaded, but load did not return the saved epoch. "
            "Save the epoch in the checkpoint and return checkpoint['epoch']."
        )
    locations = {location for report in ranks for location in report["locations"]}
    if locations != {"cpu"}:
        return False, (
            "FAIL: torch.load ran without map_location=device: on GPUs every rank "
            "would load the tensors onto the GPU that saved them (cuda:0). Pass "
            "map_location=device to torch.load."
        )
    return True, (
        f"PASS: on {world_size} ranks only rank 0 saved, every rank waited for the "
        "file and loaded it with map_location, and got epoch 2's weights."
    )


def _one_process(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int
) -> dict[str, torch.Tensor]:
    """The weights after ``steps`` SGD steps on the global batches, in one process."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for X_step, y_step in zip(X.chunk(steps), y.chunk(steps)):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(X_step), y_step).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def check_accumulation(
    step: Callable,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    world_size: int = 2,
    micro_batches: int = 4,
) -> tuple[bool, str]:
    """Does ``step(ddp_model, optimizer, micro)`` take one optimizer step over the
    list of (X, y) micro-batches, all-reducing the gradients once, on the last
    micro-batch, and train like one process on the global batch? (passed, what to
    fix) (09b). Two steps; ``len(X)`` must split into 2 global batches of
    ``world_size × micro_batches`` equal micro-batches. ``step`` must live in a
    module the ranks can import (``%%module``)."""
    steps = 2
    ranks = spawn(
        accumulation_probe_rank, world_size, step, model, X, y, micro_batches, steps
    )
    first = ranks[0]
    synced = first["synced"]
    last = micro_batches - 1
    before = {name: p.detach() for name, p in model.named_parameters()}
    if max_parameter_difference(first["parameters"], before) == 0:
        return False, (
            "FAIL: the weights never changed. After the last micro-batch's backward, "
            "call optimizer.step(), then optimizer.zero_grad()."
        )
    if all(len(reduces) == micro_batches for reduces in synced):
        if first["used no_sync"]:
            return False, (
                "FAIL: every micro-batch all-reduced although you used no_sync(): "
                "the forward ran outside it. DDP decides in forward() whether the "
                "coming backward syncs, so put the forward and the backward inside "
                "`with model.no_sync():`."
            )
        return False, (
            f"FAIL: every micro-batch all-reduced ({micro_batches} per step): "
            "nothing skipped the sync. Run the forward and backward of every "
            "micro-batch but the last inside `with model.no_sync():`."
        )
    if all(not reduces for reduces in synced):
        return False, (
            "FAIL: no micro-batch all-reduced: the ranks never averaged their "
            "gradients. Leave the last micro-batch outside no_sync(), so its "
            "backward syncs the gradients summed so far."
        )
    if any(reduces != [last] for reduces in synced):
        return False, (
            f"FAIL: the all-reduces ran on micro-batches {synced} of each step, not "
            f"only on the last ({last}). If you set model.require_backward_grad_sync, "
            "set it before the forward: DDP reads it in forward(), so set after the "
            "forward it acts one micro-batch late. Or use `with model.no_sync():`."
        )
    apart = max_parameter_difference(first["parameters"], ranks[-1]["parameters"])
    reference = _one_process(model, X, y, steps)
    distance = max_parameter_difference(first["parameters"], reference)
    if apart > 0 or distance > 1e-9:
        return False, (
            f"FAIL: each step synced once, on the last micro-batch, but the weights "
            f"end {distance:.1e} away from one process on the global batch. Divide "
            f"each micro-batch's loss by their number ({micro_batches}) before "
            "backward(), and zero the gradients only after optimizer.step()."
        )
    return True, (
        f"PASS: on {world_size} ranks each step all-reduced once, on the last of its "
        f"{micro_batches} micro-batches, and the weights equal one process on the "
        "global batch."
    )
