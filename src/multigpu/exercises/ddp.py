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
from multigpu.exercises._learner_code import last_line, ranks_were_stuck
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.ddp_exercises import accumulation_probe_rank, checkpoint_probe_rank
from multigpu.runtime.launch import QUICK_TIMEOUT_S, WorkerError, spawn


def _raised(error: WorkerError, what: str) -> str:
    """A FAIL naming the exception a learner's ``what`` raised on a rank, or a
    collective that some ranks never joined."""
    if ranks_were_stuck(error):
        return (
            f"FAIL: the ranks waited for each other until the timeout: a collective "
            f"in your {what} ran on some ranks only, and the others never joined it."
        )
    return f"FAIL: your {what} raised on rank {error.rank}: {last_line(error)}"


def check_checkpoint(
    save: Callable,
    load: Callable,
    world_size: int = 2,
    timeout: float = QUICK_TIMEOUT_S,
) -> ExerciseResult:
    """Does ``save(path, model, optimizer, epoch)`` write the checkpoint on rank 0
    only, and does ``load(path, model, optimizer, device)`` wait for it and load it
    with ``map_location=device`` on every rank, restoring the weights and the
    optimizer's momentum and returning the epoch? (passed, what is wrong) (09b).
    Both must live in a module the ranks can import (``%%module``)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            ranks = spawn(
                checkpoint_probe_rank, world_size, save, load, folder, timeout=timeout
            )
        except WorkerError as error:
            if ranks_were_stuck(error):
                return fail(
                    "FAIL: the ranks did not call dist.barrier() together: rank 0 "
                    "waited at a barrier the other ranks never reached (a barrier "
                    "only returns once every rank has called it)."
                )
            return fail(_raised(error, "save"))
    failed = [(r, report) for r, report in enumerate(ranks) if report["load error"]]
    if failed:
        rank, report = failed[0]
        kind, text = report["load error"]
        if kind == "KeyError":
            held = ", ".join(repr(key) for key in report["saved keys"]) or "nothing"
            return fail(
                f"FAIL: load raised KeyError on rank {rank}: it looked up {text}, but "
                f"the checkpoint that save wrote holds {held}. Save and load must "
                "agree on the names of what the file holds."
            )
        return fail(f"FAIL: your load raised on rank {rank}: {kind}: {text}")
    if not ranks[0]["saves"]:
        return fail(
            "FAIL: rank 0 never saved: no torch.save ran on rank 0, so there is no "
            "file to resume from."
        )
    savers = [rank for rank, report in enumerate(ranks) if rank and report["saves"]]
    if savers:
        return fail(
            f"FAIL: rank {savers[0]} saved too: every rank wrote the same file at the "
            "same time, though they all hold the same weights (one writer is enough, "
            "and several can leave a file mixed from different ranks' writes)."
        )
    stale = [
        r for r, report in enumerate(ranks) if not report["loaded epoch 2's weights"]
    ]
    if stale:
        return fail(
            f"FAIL: rank {stale[0]} loaded the previous checkpoint: it read the file "
            "before rank 0 had finished writing the new one (nothing made the other "
            "ranks wait for rank 0's save)."
        )
    lost = [
        r for r, report in enumerate(ranks) if not report["loaded epoch 2's momentum"]
    ]
    if lost:
        buffers = ranks[lost[0]]["momentum buffers after load"]
        what = "are missing" if buffers == 0 else "are not the saved ones"
        return fail(
            f"FAIL: the optimizer's state did not come back: after load its momentum "
            f"buffers {what} on rank {lost[0]}, so a resumed run's next steps would "
            "differ from the uninterrupted run's (the weights alone are not the "
            "whole training state)."
        )
    epochs = {report["loaded epoch"] for report in ranks}
    if epochs != {2}:
        return fail(
            "FAIL: the weights and the optimizer were loaded, but load returned "
            f"{sorted(epochs, key=repr)[0]!r} instead of the saved epoch (2), so a "
            "resumed run would not know where to start."
        )
    locations = {location for report in ranks for location in report["locations"]}
    if locations != {"cpu"}:
        return fail(
            "FAIL: torch.load ran without map_location: on GPUs every rank would "
            "load the tensors onto the GPU that saved them (cuda:0), not onto its "
            "own device."
        )
    return ok(
        f"PASS: on {world_size} ranks only rank 0 saved, every rank waited for the "
        "file and loaded it with map_location, and got epoch 2's weights and "
        "momentum."
    )


def _one_process(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int, lr: float = 0.1
) -> dict[str, torch.Tensor]:
    """The weights after ``steps`` SGD steps on the global batches, in one process."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for X_step, y_step in zip(X.chunk(steps), y.chunk(steps)):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(X_step), y_step).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _step_raised(error: WorkerError) -> str:
    """A FAIL naming what the learner's accumulation step raised on a rank."""
    last = last_line(error)
    if "AttributeError" in last and "no_sync" in last:
        return (
            f"FAIL: step raised AttributeError: it asked the wrapped module "
            f"(model.module) for no_sync, which only DDP has: the module inside the "
            f"wrapper is a plain nn.Module that knows nothing of ranks ({last})."
        )
    return _raised(error, "step")


def check_accumulation(
    step: Callable,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    world_size: int = 2,
    micro_batches: int = 4,
) -> ExerciseResult:
    """Does ``step(ddp_model, optimizer, micro)`` take one optimizer step over the
    list of (X, y) micro-batches, all-reducing the gradients once, on the last
    micro-batch, and train like one process on the global batch? (passed, what is
    wrong) (09b). Two steps; ``len(X)`` must split into 2 global batches of
    ``world_size × micro_batches`` equal micro-batches. ``step`` must live in a
    module the ranks can import (``%%module``)."""
    steps = 2
    try:
        ranks = spawn(
            accumulation_probe_rank,
            world_size,
            step,
            model,
            X,
            y,
            micro_batches,
            steps,
        )
    except WorkerError as error:
        return fail(_step_raised(error))
    first = ranks[0]
    synced = first["synced"]
    last = micro_batches - 1
    before = {name: p.detach() for name, p in model.named_parameters()}
    if max_parameter_difference(first["parameters"], before) == 0:
        return fail(
            "FAIL: the weights never changed: no optimizer step moved them (it was "
            "never taken, or found no gradients to apply). Look at optimizer.step() "
            "and at when the gradients are cleared."
        )
    if all(len(reduces) == micro_batches for reduces in synced):
        if first["used no_sync"]:
            return fail(
                "FAIL: every micro-batch all-reduced although you used no_sync(): "
                "the forward ran outside it, and DDP decides in forward() whether "
                "the coming backward syncs."
            )
        return fail(
            f"FAIL: every micro-batch all-reduced ({micro_batches} per step): "
            "nothing skipped the sync, so each step sent the gradients "
            f"{micro_batches} times where once, on the last micro-batch, is enough."
        )
    if all(not reduces for reduces in synced):
        return fail(
            "FAIL: no micro-batch all-reduced: the ranks never averaged their "
            "gradients, so each stepped with its own (every micro-batch, the last "
            "one too, skipped the sync)."
        )
    if any(reduces != [last] for reduces in synced):
        return fail(
            f"FAIL: the all-reduces ran on micro-batches {synced} of each step, not "
            f"only on the last ({last}): the sync came one micro-batch late. DDP "
            "reads model.require_backward_grad_sync in forward(), so a value set "
            "after the forward only acts on the next micro-batch."
        )
    apart = max_parameter_difference(first["parameters"], ranks[-1]["parameters"])
    reference = _one_process(model, X, y, steps)
    distance = max_parameter_difference(first["parameters"], reference)
    if apart > 0 or distance > 1e-9:
        summed = _one_process(model, X, y, steps, lr=0.1 * micro_batches)
        if max_parameter_difference(first["parameters"], summed) < 1e-9:
            return fail(
                f"FAIL: each step synced once, on the last micro-batch, but took "
                f"{micro_batches} times the global batch's step: the gradients of "
                f"the {micro_batches} micro-batch losses were added up, which is "
                "the gradient of their sum, not of the mean loss over the batch."
            )
        return fail(
            f"FAIL: each step synced once, on the last micro-batch, but the weights "
            f"end {distance:.1e} away from one process on the global batch: the "
            "accumulated gradients are not those of the mean loss over the batch "
            "(look at how each micro-batch's loss is scaled, and at when the "
            "gradients are cleared)."
        )
    return ok(
        f"PASS: on {world_size} ranks each step all-reduced once, on the last of its "
        f"{micro_batches} micro-batches, and the weights equal one process on the "
        "global batch."
    )
