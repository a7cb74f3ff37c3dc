"""The checkers of notebook 15's exercises: the conjugate operators f and g with a
row-parallel linear (:func:`check_row_parallel`) and the vocabulary-parallel
cross-entropy (:func:`check_vocab_parallel_loss`), each run on 2 ranks against one
process; the message names the mistake (15). Exercise 4's checker,
:func:`check_2d_plan`, is in :mod:`multigpu.exercises.tensor_parallel_plan`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from multigpu.core.reproducibility import round_sig
from multigpu.exercises._learner_code import importable_or_raise
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.exercises.tensor_parallel_plan import check_2d_plan, describe_failure
from multigpu.ranks.tensor_parallel import loss_exercise_rank, mlp_exercise_rank
from multigpu.runtime.launch import (
    DEFAULT_TIMEOUT_S,
    WorkerError,
    spawn,
)
from multigpu.tensor_parallel import MLP, column_shard, row_shard

__all__ = ["check_2d_plan", "check_row_parallel", "check_vocab_parallel_loss"]

WORLD_SIZE = 2
CLOSE = 1e-9  # float64: a right answer is ~1e-15 away
VOCAB = 64  # exercise 2's vocabulary
TIMEOUT_S = DEFAULT_TIMEOUT_S  # a collective that not every rank runs fails after this


def _near(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and (a - b).abs().max().item() < CLOSE


def _mlp_problem() -> tuple[MLP, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    mlp = MLP(4, 8).double()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    grad_out = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    return mlp, x, grad_out


def _partial_x_grads(mlp: MLP, x: torch.Tensor, grad_out: torch.Tensor) -> list:
    """Each rank's share of the input's gradient: what f's backward must sum."""
    shares = []
    for rank in range(WORLD_SIZE):
        w1 = column_shard(mlp.fc1.weight.detach(), rank, WORLD_SIZE)
        b1 = column_shard(mlp.fc1.bias.detach(), rank, WORLD_SIZE)
        w2 = row_shard(mlp.fc2.weight.detach(), rank, WORLD_SIZE)
        xr = x.clone().requires_grad_(True)
        F.linear(F.gelu(F.linear(xr, w1, b1)), w2).backward(grad_out)
        shares.append(xr.grad)
    return shares


def check_row_parallel(
    copy_to: type[torch.autograd.Function],
    reduce_from: type[torch.autograd.Function],
    row_parallel_linear: Callable[..., torch.Tensor],
) -> ExerciseResult:
    """Run an MLP split over 2 ranks with the learner's f (``copy_to``), g
    (``reduce_from``) and ``row_parallel_linear(x_shard, weight_shard, bias)``;
    compare output and gradients with one process (15's exercise 1)."""
    for obj, what in ((copy_to, "f"), (reduce_from, "g")):
        importable_or_raise(obj, what, passed="object")
    importable_or_raise(row_parallel_linear, "function", passed="object")
    mlp, x, grad_out = _mlp_problem()
    xr = x.clone().requires_grad_(True)
    expected = mlp(xr)
    expected.backward(grad_out)
    try:
        results = spawn(
            mlp_exercise_rank,
            WORLD_SIZE,
            copy_to,
            reduce_from,
            row_parallel_linear,
            mlp,
            x,
            grad_out,
            timeout=TIMEOUT_S,
        )
    except WorkerError as error:
        return fail(describe_failure(error))
    bias = mlp.fc2.bias.detach()
    for rank, result in enumerate(results):
        out = result["out"]
        if out.shape != expected.shape:
            return fail(
                f"FAIL: rank {rank}'s output has shape {tuple(out.shape)}, not "
                f"{tuple(expected.shape)}: the ranks' partial outputs were "
                "concatenated (an all-gather?), but each of them is a partial sum "
                "of the same output features."
            )
        if _near(out, expected + (WORLD_SIZE - 1) * bias):
            return fail(
                "FAIL: the output is off by (world size - 1) x bias: every rank "
                "added the bias before the all-reduce, which then summed it "
                f"{WORLD_SIZE} times."
            )
        if not _near(out, expected):
            return fail(
                f"FAIL: rank {rank}'s output differs from one process by "
                f"{round_sig((out - expected).abs().max().item())}: each rank holds "
                "only a partial sum of x·Aᵀ, and every rank must end with the whole "
                "sum (look at the forward of g, and of f)."
            )
    shares = _partial_x_grads(mlp, x, grad_out)
    for rank, result in enumerate(results):
        x_grad = result["x_grad"]
        if _near(x_grad, shares[rank]):
            return fail(
                "FAIL: the output is right, but the input's gradient is only this "
                "rank's part of it: each rank's weight shard contributes a partial "
                "gradient, and nothing adds them up (look at f's backward)."
            )
        if _near(x_grad, WORLD_SIZE * xr.grad):
            return fail(
                f"FAIL: the input's gradient is {WORLD_SIZE} times too large: g's "
                "backward all-reduces a gradient that is already whole on every "
                "rank."
            )
        if not _near(x_grad, xr.grad):
            return fail(
                "FAIL: the output is right but the input's gradient differs from "
                "one process by "
                f"{round_sig((x_grad - xr.grad).abs().max().item())}: look at the "
                "backward of f and of g (which of them has partial gradients to "
                "add up?)."
            )
    for rank, result in enumerate(results):
        grads = result["grads"]
        expected_grads = {
            "fc1.weight": column_shard(mlp.fc1.weight.grad, rank, WORLD_SIZE),
            "fc1.bias": column_shard(mlp.fc1.bias.grad, rank, WORLD_SIZE),
            "fc2.weight": row_shard(mlp.fc2.weight.grad, rank, WORLD_SIZE),
            "fc2.bias": mlp.fc2.bias.grad,
        }
        for name, want in expected_grads.items():
            if grads[name] is None or not _near(grads[name], want):
                return fail(
                    f"FAIL: output and input gradient are right, but rank {rank}'s "
                    f"gradient of {name} is not its shard of one process's."
                )
    return ok(
        f"PASS: on {WORLD_SIZE} ranks the MLP's output and all gradients equal one "
        "process: one all-reduce forward (g), one backward (f)."
    )


def _loss_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Moderate logits whose maxima differ between the ranks' halves, and logits
    around 1000 (exp overflows without the shift); targets on both halves. The
    vocabulary (64) is much larger than what a right loss sends per token."""
    generator = torch.Generator().manual_seed(2)
    moderate = torch.randn(6, VOCAB, generator=generator, dtype=torch.float64) * 3
    moderate[:, : VOCAB // 2] += 5.0  # rank 0's half holds the larger logits
    large = 1000 + torch.randn(6, VOCAB, generator=generator, dtype=torch.float64)
    target = torch.tensor([0, 63, 17, 40, 50, 5])
    return [(moderate, target), (large, target)]


def _wrong_losses(logits: torch.Tensor, target: torch.Tensor) -> dict[str, list]:
    """What each rank computes when one of the three collectives is left out."""
    halves = logits.tensor_split(WORLD_SIZE, dim=-1)
    width = halves[0].shape[-1]
    peak = logits.max(dim=-1).values
    rows = torch.arange(len(target))
    owner = target // width
    picked = logits[rows, target] - peak
    total = (logits - peak[:, None]).exp().sum(-1)
    local_peaks = [h.max(dim=-1).values for h in halves]
    mixed_sum = sum((h - m[:, None]).exp().sum(-1) for h, m in zip(halves, local_peaks))
    mixed_pick = logits[rows, target] - torch.stack(local_peaks)[owner, rows]
    wrong: dict[str, list] = {"max": [], "sum": [], "target": []}
    for rank, half in enumerate(halves):
        wrong["max"].append(mixed_sum.log() - mixed_pick)
        local_sum = (half - peak[:, None]).exp().sum(-1)
        wrong["sum"].append(local_sum.log() - picked)
        wrong["target"].append(total.log() - picked * (owner == rank))
    return wrong


_LOSS_MISTAKES = {
    "max": (
        "FAIL: each rank subtracted its own maximum, so the ranks' exponentials "
        "are scaled by different factors and their sum is not the softmax's "
        "normaliser: the shift must be one number per token, the same on every "
        "rank (look at all_reduce_max)."
    ),
    "sum": (
        "FAIL: every rank's loss uses only its own slice of the vocabulary: the "
        "normaliser (the sum of exponentials) must cover all ranks."
    ),
    "target": (
        "FAIL: the loss is right only where this rank holds the token's target: "
        "the target's logit lives on one rank, and every rank's loss needs it."
    ),
    "overflow": (
        "FAIL: the loss is not finite for logits around 1000: exp overflows "
        "float64 above about 709, so the exponentials need a shift that is the "
        "same on every rank."
    ),
}


def _gathered(rank: int, moved: int, tokens: int, local: int) -> str:
    return (
        f"FAIL: rank {rank}'s collectives moved {moved} numbers for {tokens} tokens, "
        f"more than its own {local} logits: the logits were gathered (or summed "
        "into a tensor as wide as the vocabulary). That is the batch·seq·vocab "
        "exchange a vocabulary-parallel loss exists to avoid: each token needs "
        "only a few numbers from the other ranks."
    )


def check_vocab_parallel_loss(
    loss_function: Callable[..., torch.Tensor],
) -> ExerciseResult:
    """Run the learner's per-token ``loss_function(local_logits, target, start)``
    on 2 ranks and compare with ``F.cross_entropy(..., reduction="none")`` of the
    whole logits; refuse a loss whose collectives move as many numbers as the
    rank's logits (15's exercise 2)."""
    importable_or_raise(loss_function, "function", passed="object")
    cases = _loss_cases()
    try:
        results = spawn(
            loss_exercise_rank, WORLD_SIZE, loss_function, cases, timeout=TIMEOUT_S
        )
    except WorkerError as error:
        return fail(describe_failure(error))
    most = 0
    for index, (logits, target) in enumerate(cases):
        expected = F.cross_entropy(logits, target, reduction="none")
        wrong = _wrong_losses(logits, target)
        local = logits.numel() // WORLD_SIZE  # the logits one rank holds
        for rank, per_rank in enumerate(results):
            loss, moved = per_rank["losses"][index], per_rank["communicated"][index]
            most = max(most, moved)
            if loss.shape != expected.shape:
                return fail(
                    f"FAIL: the loss has shape {tuple(loss.shape)}: one loss per "
                    f"token has shape {tuple(expected.shape)}."
                )
            if moved >= local:
                return fail(_gathered(rank, moved, len(target), local))
            if not torch.isfinite(loss).all():
                return fail(_LOSS_MISTAKES["overflow"])
            if _near(loss, expected):
                continue
            for mistake, values in wrong.items():
                if _near(loss, values[rank]):
                    return fail(_LOSS_MISTAKES[mistake])
            return fail(
                f"FAIL: rank {rank}'s loss differs from the full cross-entropy by "
                f"{round_sig((loss - expected).abs().max().item())}, and not in one "
                "of the usual ways (a rank's own maximum, its own sum of "
                "exponentials, a target's logit known to one rank only). A token's "
                "loss weighs its target's logit against all V logits, spread over "
                "the ranks: compare each part with one process on a small example."
            )
    tokens = len(cases[0][1])
    return ok(
        f"PASS: on {WORLD_SIZE} ranks your loss equals the full cross-entropy, for "
        f"logits around 1000 too, and no rank's collectives moved more than {most} "
        f"numbers for {tokens} tokens (a rank holds {VOCAB // WORLD_SIZE} logits "
        "per token): the logits were never gathered."
    )
