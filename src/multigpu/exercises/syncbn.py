"""The checker of notebook 09b's SyncBatchNorm exercise, where the learner combines
every rank's per-channel (count, mean, M2) into the global batch's mean and
variance (09b)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from multigpu.exercises._result import ExerciseResult, fail, ok


def per_rank_statistics(
    shards: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(counts (R,), means (R, C), m2s (R, C))`` of shards (n_r, C), one per rank,
    as each rank computes them before the exchange; an empty shard has count 0 and
    mean 0 (09b)."""
    counts = torch.tensor([len(x) for x in shards], dtype=shards[0].dtype)
    means = torch.stack([x.sum(0) / max(len(x), 1) for x in shards])
    m2s = torch.stack([((x - m) ** 2).sum(0) for x, m in zip(shards, means)])
    return counts, means, m2s


def _shards(dtype: torch.dtype, offset: float) -> list[torch.Tensor]:
    """Three ranks with 5, 0 and 11 samples of 3 channels, each rank's own spread."""
    generator = torch.Generator().manual_seed(0)
    sizes, shifts = (5, 0, 11), (0.0, 0.0, 3.0)
    return [
        (
            offset + shift + torch.randn(n, 3, generator=generator, dtype=torch.float64)
        ).to(dtype)
        for n, shift in zip(sizes, shifts)
    ]


def _nan_mistake(got_mean: torch.Tensor, got_var: torch.Tensor) -> str | None:
    """Why the result holds NaN (a FAIL message), or None."""
    nan = [
        name
        for name, t in (("mean", got_mean), ("variance", got_var))
        if t.isnan().any()
    ]
    if not nan:
        return None
    return (
        f"FAIL: your {' and '.join(nan)} is NaN: the rank with 0 samples divides by "
        "its count of 0 (0 / 0 is NaN), and weighing that NaN by the count 0 does not "
        "remove it (0 × NaN is NaN). An empty rank must add nothing to the sums."
    )


def check_combine(combine: Callable) -> ExerciseResult:
    """Does ``combine(counts, means, m2s)`` return the global ``(mean, var)`` per
    channel, ``var`` the biased variance BatchNorm normalises with, in float64 and
    in float32 with a large mean? (passed, what is wrong) (09b)."""
    for dtype, offset, tolerance in (
        (torch.float64, 0.0, 1e-12),
        (torch.float32, 1e4, 1e-3),
    ):
        shards = _shards(dtype, offset)
        whole = torch.cat(shards).double()
        var, mean = torch.var_mean(whole, dim=0, correction=0)
        n = len(whole)
        counts, means, m2s = per_rank_statistics(shards)
        try:
            got_mean, got_var = (
                torch.as_tensor(t).double() for t in combine(counts, means, m2s)
            )
        except Exception as error:  # the learner's code: a FAIL, never a traceback
            return fail(
                f"FAIL: combine raised {type(error).__name__}: {error}. It gets "
                "counts (ranks,), means and m2s (ranks, channels) and returns "
                "(mean, var), each (channels,)."
            )
        nan = _nan_mistake(got_mean, got_var)
        if nan:
            return fail(nan)
        if (got_mean - mean).abs().max() > tolerance * max(1.0, offset):
            equal_weights = torch.allclose(got_mean, means.double().mean(0))
            why = (
                "your mean weighs every rank's mean the same (the empty one too), "
                "though the ranks hold different numbers of samples"
                if equal_weights
                else "each rank's mean must count as many times as it has samples"
            )
            return fail(
                "FAIL: the mean is not the global batch's: with ranks of 5, 0 and 11 "
                f"samples, {why}."
            )
        if torch.allclose(got_var, var * n / (n - 1), rtol=tolerance, atol=0):
            return fail(
                "FAIL: your variance divides by N - 1 (unbiased), but BatchNorm "
                "normalises with the biased variance (the unbiased one is only "
                "for running_var)."
            )
        if torch.allclose(got_var, var, rtol=tolerance, atol=0):
            continue
        within = m2s.sum(0)  # each rank's own M2
        if torch.allclose(got_var, within.double() / n, rtol=1e-3, atol=0):
            return fail(
                "FAIL: your variance adds only each rank's M2, the spread around its "
                "own mean, and leaves out how far the ranks' means lie from the "
                "global mean (rank 2's values are shifted by 3)."
            )
        if dtype == torch.float32:
            return fail(
                "FAIL: right in float64, but in float32 with values near 1e4 your "
                f"variance is {got_var.min().item():.3g} instead of about "
                f"{var.min().item():.3g}: it subtracts two numbers near 1e8 whose "
                "difference is about 1, and float32 keeps only about 7 digits "
                "(E[x²] − mean² cancels)."
            )
        return fail(
            "FAIL: the mean is right, but the variance is not the global batch's "
            "biased variance: the ranks' M2s must be added up about the global mean."
        )
    return ok(
        "PASS: the global mean and biased variance, with ranks of 5, 0 and 11 "
        "samples, in float64 and in float32 around 1e4."
    )
