"""The checker of notebook 15's exercise 4: a ``parallelize_module`` plan for a
transformer block on a 2-D (dp, tp) mesh, with FSDP2 over dp (15).

:func:`check_2d_plan` runs the learner's ``parallelize(block, mesh)`` on 4 ranks, a
(2, 2) mesh, and one forward and backward on each dp group's half of a batch. It
reads which style reached which linear layer over which mesh dimension, so that it
names a wrong plan (both layers of a pair cut by columns, the pair in the wrong
order, a layer left out, the wrong mesh dimension, the head count, no FSDP) before
it compares the output and every gradient with one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from multigpu.core.reproducibility import round_sig
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.tensor_parallel import plan_exercise_rank
from multigpu.runtime.launch import DEFAULT_TIMEOUT_S, WorkerError, spawn
from multigpu.tensor_parallel import make_block

WORLD_SIZE = 4  # a (dp, tp) = (2, 2) mesh
HEADS = 4
CLOSE = 1e-9  # float64: a right answer is ~1e-15 away
TIMEOUT_S = DEFAULT_TIMEOUT_S  # a collective that not every rank runs fails after this
# Megatron's pairs: the first layers cut by columns, the second by rows.
PAIRS = {"the attention": (("attn.q", "attn.k", "attn.v"), "attn.out")}
PAIRS["the MLP"] = (("mlp.fc1",), "mlp.fc2")
COLUMN, ROW = "ColwiseParallel", "RowwiseParallel"


def _problem() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    block = make_block(hidden=8, heads=HEADS, ffn=16)
    generator = torch.Generator().manual_seed(5)
    X = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
    Y = torch.randn(4, 8, 8, generator=generator, dtype=torch.float64)
    return block, X, Y


def _plan_mistake(result: dict[str, Any]) -> str | None:
    """What is wrong with the styles and meshes the learner's plan applied."""
    applied = result["applied"]
    if not applied:
        return (
            "FAIL: no linear layer of the block was split: no ColwiseParallel or "
            "RowwiseParallel reached it, so every rank still holds every weight "
            "whole."
        )
    meshes = {dims for _, dims in applied.values()}
    if any(len(dims) > 1 for dims in meshes):
        return (
            "FAIL: parallelize_module was given the whole 2-D mesh: a style cuts a "
            "layer over one dimension of it."
        )
    if ("dp",) in meshes:
        return (
            'FAIL: the layers were split over the mesh\'s "dp" dimension. Its '
            "ranks hold different halves of the batch, but the ranks that share "
            "a layer's pieces must compute on the same input."
        )
    for what, (firsts, second) in PAIRS.items():
        missing = [name for name in (*firsts, second) if name not in applied]
        if missing:
            return (
                f"FAIL: the plan leaves {', '.join(missing)} whole on every rank. "
                f"In {what}, {', '.join(firsts)} and {second} work as a pair: once "
                "one of them is split, each rank holds only its part of the "
                "features between them, which a whole layer cannot take or give."
            )
        kinds = {applied[name][0] for name in firsts}
        last = applied[second][0]
        named = ", ".join(firsts)
        are = "are" if len(firsts) > 1 else "is"
        if kinds == {COLUMN} and last == COLUMN:
            return (
                f"FAIL: in {what} every layer is ColwiseParallel: {named} {are} "
                "cut by columns, so each rank holds a slice of the features they "
                f"produce, and a column-parallel {second} expects all of them."
            )
        if kinds == {ROW} and last == COLUMN:
            return (
                f"FAIL: {what} is cut in the wrong order: {named} {are} "
                f"RowwiseParallel and {second} ColwiseParallel. A row-parallel "
                "layer reads a slice of its input features, but the block's input "
                "is whole on every rank."
            )
        if kinds == {ROW} and last == ROW:
            return (
                f"FAIL: in {what} every layer is RowwiseParallel: {named} {are} "
                "cut by rows, so each expects a slice of its input features, but "
                "the block's input is whole on every rank."
            )
        if kinds != {COLUMN} or last != ROW:
            styles = ", ".join(f"{n}: {applied[n][0]}" for n in (*firsts, second))
            return f"FAIL: {what}'s layers are cut in different ways ({styles})."
    if result["error"] and result["stage"] == "parallelize":
        return f"FAIL: your function raised {result['error']}"
    if result["heads"] == HEADS:
        return (
            f"FAIL: the attention still counts {HEADS} heads on each rank, but "
            "each rank now holds the q, k and v features of only some of them, so "
            "its heads come out too narrow."
        )
    if result["layer_norm_mesh"] == ():
        return (
            'FAIL: nothing shards the block over "dp": the LayerNorm weights are '
            "plain tensors on every rank, and no one averages the gradients of "
            "the two halves of the batch."
        )
    if result["layer_norm_mesh"] != ("dp",):
        return (
            "FAIL: fully_shard ran over the mesh dimension "
            f"{result['layer_norm_mesh']}, not over the data-parallel one."
        )
    return None


def _compare(results: list[dict[str, Any]]) -> str | None:
    """The first rank whose output or gradient differs from one process."""
    block, X, Y = _problem()
    out = block(X)
    ((out - Y) ** 2).mean().backward()
    for rank, result in enumerate(results):
        want = out.detach().chunk(2)[result["dp"]]
        got = result["out"]
        if got.shape != want.shape or (got - want).abs().max().item() > CLOSE:
            distance = "shape " + str(tuple(got.shape))
            if got.shape == want.shape:
                distance = f"{round_sig((got - want).abs().max().item())}"
            return (
                f"FAIL: rank {rank}'s output differs from one process ({distance}), "
                "although every layer is cut as in Megatron's pairs: look at the "
                "layouts your styles give the block's input and output, which are "
                "whole on every rank."
            )
        for name, parameter in block.named_parameters():
            grad = result["grads"][name]
            if grad is None or (grad - parameter.grad).abs().max().item() > CLOSE:
                return (
                    f"FAIL: the output is right, but rank {rank}'s gradient of "
                    f"{name} differs from one process's on the whole batch."
                )
    return None


def describe_failure(error: WorkerError) -> str:
    """A rank's exception, a collective mismatch or a collective that one rank never
    ran, as a FAIL that names it (15's checkers)."""
    said = f"{error}\n{error.traceback}\n{error.stderr}"
    if "collective mismatch" in said or "doesn't match expected size" in said:
        return (
            "FAIL: the ranks' collectives do not match: a rank received a message "
            "of another size than it expected, because one rank ran a collective "
            "that its peer did not run, or ran it in another order."
        )
    if error.timed_out or "closed by peer" in said or "reset by peer" in said:
        return (
            "FAIL: a rank waited in a collective that another rank never ran (that "
            "rank had finished or failed): every collective needs every rank."
        )
    return f"FAIL: a rank raised {last_line(error)}"


def check_2d_plan(parallelize: Callable[..., Any]) -> ExerciseResult:
    """Run the learner's ``parallelize(block, mesh)`` on a (dp, tp) = (2, 2) mesh
    of 4 ranks; name a wrong plan, then compare each rank's output and the whole
    gradients with one process on the whole batch (15's exercise 4)."""
    importable_or_raise(parallelize, "function", passed="object")
    block, X, Y = _problem()
    try:
        results = spawn(
            plan_exercise_rank, WORLD_SIZE, parallelize, block, X, Y, timeout=TIMEOUT_S
        )
    except WorkerError as error:
        return fail(describe_failure(error))
    first = results[0]
    mistake = _plan_mistake(first)
    if mistake:
        return fail(mistake)
    if first["error"]:
        return fail(f"FAIL: the block's {first['stage']} raised {first['error']}")
    mistake = _compare(results)
    if mistake:
        return fail(mistake)
    return ok(
        "PASS: on a (dp, tp) = (2, 2) mesh your block's output on each dp group's "
        "half of the batch and all its gradients equal one process's: q, k, v and "
        "fc1 cut by columns, attn.out and fc2 by rows over tp, sharded over dp."
    )
