"""The checkers of notebook 15's exercises: the conjugate operators f and g with a
row-parallel linear (:func:`check_row_parallel`) and the vocabulary-parallel
cross-entropy (:func:`check_vocab_parallel_loss`), each run on 2 ranks against one
process; the message names the mistake (15)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from multigpu.core.reproducibility import round_sig
from multigpu.exercises._learner_code import importable_or_raise, last_line
from multigpu.ranks.tensor_parallel import loss_exercise_rank, mlp_exercise_rank
from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from multigpu.tensor_parallel import MLP, column_shard, row_shard

WORLD_SIZE = 2
CLOSE = 1e-9  # float64: a right answer is ~1e-15 away


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
) -> tuple[bool, str]:
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
            timeout=30.0,
        )
    except WorkerError as error:
        return False, f"FAIL: a rank raised {last_line(error)}"
    bias = mlp.fc2.bias.detach()
    for rank, result in enumerate(results):
        out = result["out"]
        if out.shape != expected.shape:
            return False, (
                f"FAIL: rank {rank}'s output has shape {tuple(out.shape)}, not "
                f"{tuple(expected.shape)}: the ranks' partial outputs were "
                "concatenated (an all-gather?). A row-parallel linear sums them: "
                "g's forward is an all-reduce."
            )
        if _near(out, expected + (WORLD_SIZE - 1) * bias):
            return False, (
                "FAIL: the output is off by (world size - 1) x bias: every rank "
                "added the bias before the all-reduce, which then summed it "
                f"{WORLD_SIZE} times. Add the bias once, after the all-reduce."
            )
        if not _near(out, expected):
            return False, (
                f"FAIL: rank {rank}'s output differs from one process by "
                f"{round_sig((out - expected).abs().max().item())}: each rank holds "
                "a partial sum of x·Aᵀ; g's forward must all-reduce it (the sum), "
                "and f's forward must return its input unchanged."
            )
    shares = _partial_x_grads(mlp, x, grad_out)
    for rank, result in enumerate(results):
        x_grad = result["x_grad"]
        if _near(x_grad, shares[rank]):
            return False, (
                "FAIL: the output is right, but the input's gradient is only this "
                "rank's part of it: f's backward is missing its all-reduce. Each "
                "rank's weight shard contributes a partial gradient; sum them."
            )
        if _near(x_grad, WORLD_SIZE * xr.grad):
            return False, (
                f"FAIL: the input's gradient is {WORLD_SIZE} times too large: g's "
                "backward all-reduces a gradient that is already whole on every "
                "rank. g's backward is the identity (return grad)."
            )
        if not _near(x_grad, xr.grad):
            return False, (
                "FAIL: the output is right but the input's gradient differs from "
                "one process by "
                f"{round_sig((x_grad - xr.grad).abs().max().item())}: f's backward "
                "all-reduces (sums) the gradient; g's backward returns it unchanged."
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
                return False, (
                    f"FAIL: output and input gradient are right, but rank {rank}'s "
                    f"gradient of {name} is not its shard of one process's."
                )
    return True, (
        f"PASS: on {WORLD_SIZE} ranks the MLP's output and all gradients equal one "
        "process: one all-reduce forward (g), one backward (f)."
    )


def _loss_cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Moderate logits whose maxima differ between the ranks' halves, and logits
    around 1000 (exp overflows without the shift); targets on both halves."""
    generator = torch.Generator().manual_seed(2)
    moderate = torch.randn(6, 8, generator=generator, dtype=torch.float64) * 3
    moderate[:, :4] += 5.0  # rank 0's half holds the larger logits
    large = 1000 + torch.randn(6, 8, generator=generator, dtype=torch.float64)
    target = torch.tensor([0, 7, 3, 4, 6, 1])
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
        "are shifted by different numbers and their sum means nothing. Take the "
        "maximum over the whole vocabulary (all_reduce_max of each rank's maximum) "
        "and subtract that on every rank."
    ),
    "sum": (
        "FAIL: the sum of exponentials is only this rank's part of the vocabulary: "
        "all-reduce it (ring_all_reduce or all_reduce_sum) before the log."
    ),
    "target": (
        "FAIL: the target's logit is known only to the rank that holds that token: "
        "set it to 0 on the other ranks and all-reduce it."
    ),
}


def check_vocab_parallel_loss(
    loss_function: Callable[..., torch.Tensor],
) -> tuple[bool, str]:
    """Run the learner's per-token ``loss_function(local_logits, target, start)``
    on 2 ranks and compare with ``F.cross_entropy(..., reduction="none")`` of the
    whole logits (15's exercise 2)."""
    importable_or_raise(loss_function, "function", passed="object")
    cases = _loss_cases()
    try:
        results = spawn(
            loss_exercise_rank, WORLD_SIZE, loss_function, cases, timeout=30.0
        )
    except WorkerError as error:
        return False, f"FAIL: a rank raised {last_line(error)}"
    for index, (logits, target) in enumerate(cases):
        expected = F.cross_entropy(logits, target, reduction="none")
        wrong = _wrong_losses(logits, target)
        for rank, per_rank in enumerate(results):
            loss = per_rank[index]
            if loss.shape != expected.shape:
                return False, (
                    f"FAIL: the loss has shape {tuple(loss.shape)}; return one loss "
                    f"per token, shape {tuple(expected.shape)}."
                )
            if not torch.isfinite(loss).all():
                return False, (
                    "FAIL: the loss is not finite for logits around 1000: exp(1000) "
                    "overflows. Subtract the maximum over the whole vocabulary "
                    "before exp (all_reduce_max of each rank's maximum)."
                )
            if _near(loss, expected):
                continue
            for mistake, values in wrong.items():
                if _near(loss, values[rank]):
                    return False, _LOSS_MISTAKES[mistake]
            return False, (
                f"FAIL: rank {rank}'s loss differs from the full cross-entropy by "
                f"{round_sig((loss - expected).abs().max().item())}: it is "
                "log(sum of exp over all ranks) - the target's logit, both shifted "
                "by the global maximum."
            )
    return True, (
        f"PASS: on {WORLD_SIZE} ranks your loss equals the full cross-entropy, for "
        "logits around 1000 too, without gathering the logits."
    )
