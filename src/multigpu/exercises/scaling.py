"""The checker of notebook 12's exercise 1, where the learner fits the ring model's
α (latency per message) and B (bandwidth) to all-reduce times (12).

The times are made from a known α and B with the ring model itself, so a right fit
recovers them exactly, at every world size; a fit with a wrong count of messages or
of bytes recovers them scaled by a factor that names the mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from multigpu.costmodel import ring_bytes_theory
from multigpu.exercises._result import ExerciseResult, fail, ok

Fit = Callable[[Sequence[Mapping[str, float]]], tuple[float, float]]
"""The learner's ``fit(rows) -> (α in seconds, B in bytes per second)``, rows of
one world size with "bytes", "world_size" and "seconds"."""

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)  # bytes, as section 1 measures
CASES = ((4, 30e-6, 5e9), (3, 30e-6, 5e9), (2, 30e-6, 5e9), (4, 120e-6, 0.8e9))
RELATIVE = 1e-4  # exact times: a right least-squares fit is off by ~1e-15


def ring_times(
    world_size: int, alpha: float, bandwidth: float, sizes: Sequence[int] = SIZES
) -> list[dict[str, float]]:
    """Rows of the ring all-reduce's time t = 2(n-1)·α + 2(n-1)/n·S/B for each size
    S of ``sizes``, as the lesson's measurements hold them (12)."""
    return [
        {
            "bytes": size,
            "world_size": world_size,
            "seconds": 2 * (world_size - 1) * alpha
            + ring_bytes_theory(size, world_size) / bandwidth,
        }
        for size in sizes
    ]


def _close(value: float, expected: float, relative: float = RELATIVE) -> bool:
    return abs(value - expected) <= relative * abs(expected)


def _latency_mistake(ratio: float, n: int) -> str | None:
    """What the learner's α over the true α says about the count of messages."""
    if _close(ratio, 2 * (n - 1)):
        return (
            "your α is the latency of the whole all-reduce, not of one message: "
            "each of the ring's messages pays α"
        )
    if _close(ratio, 2.0):
        return (
            "your α is twice too large: the ring's two phases (reduce-scatter, "
            "then all-gather) send n-1 messages each"
        )
    if _close(ratio, 2 * (n - 1) / n):
        return "your α assumes n messages; count the ring's steps in both phases"
    return None


def _bandwidth_mistake(ratio: float, n: int) -> str | None:
    """What the learner's B over the true B says about the bytes counted."""
    if _close(ratio, n / (2 * (n - 1))):
        return (
            "your B assumes each rank sends the whole tensor S once; in the ring "
            "each sends its chunks in both phases, a share of S that depends on n"
        )
    if _close(ratio, 0.5):
        return (
            "your B is half the true one: you counted the bytes of one phase of the "
            "ring, and both phases send as many"
        )
    return None


def _diagnose(fitted: tuple[float, float], n: int, alpha: float, B: float) -> str:
    fitted_alpha, fitted_B = fitted
    found = f"α = {fitted_alpha * 1e6:.4g} µs and B = {fitted_B / 1e9:.4g} GB/s"
    made = f"times made with α = {alpha * 1e6:g} µs and B = {B / 1e9:g} GB/s"
    head = f"FAIL: on {made} at {n} ranks, your fit gives {found}"
    if _close(fitted_alpha, B) and _close(fitted_B, alpha):
        return f"{head}: the two are swapped. Return (α, B), in that order."
    if _close(fitted_B, 1 / B):
        return (
            f"{head}: your second number is seconds per byte (β = 1/B); the fit "
            "returns B, bytes per second."
        )
    named = []
    for right, ratio, explain in (
        (_close(fitted_alpha, alpha), fitted_alpha / alpha, _latency_mistake),
        (_close(fitted_B, B), fitted_B / B, _bandwidth_mistake),
    ):
        if not right:
            named.append(explain(ratio, n))
    if named and all(named):
        return f"{head}: " + "; ".join(named) + "."
    if _close(fitted_B, B, 0.1) and not _close(fitted_alpha, alpha, 0.1):
        return (
            f"{head}: B is nearly right, α is not. The two columns of the least "
            "squares differ by a factor of about a million (message counts near "
            "1, byte counts near 10⁷), beyond float32's 7 digits: check the "
            "precision you solve in."
        )
    return (
        f"{head}. A least-squares fit of the ring model to times made from it "
        "must give α and B back exactly: check the model's two columns (messages "
        "per all-reduce, bytes each rank sends) against section 2."
    )


def check_fit(fit: Fit) -> ExerciseResult:
    """Does ``fit(rows)`` give back α and B from ring all-reduce times made with
    them, at 4, 3 and 2 ranks and for two links? (passed, what is wrong) (12)."""
    for n, alpha, bandwidth in CASES:
        rows = ring_times(n, alpha, bandwidth)
        try:
            result = fit([dict(row) for row in rows])
            fitted = (float(result[0]), float(result[1]))
        except Exception as error:  # the learner's code: any error is a FAIL
            return fail(
                f"FAIL: your fit raised {type(error).__name__} on {len(rows)} rows "
                f"at {n} ranks: {error}. It takes a list of rows (dicts) and "
                "returns two numbers, α and B."
            )
        if not all(math.isfinite(value) for value in fitted):
            return fail(
                f"FAIL: your fit returned {fitted} at {n} ranks: α and B must be "
                "finite numbers."
            )
        if not (_close(fitted[0], alpha) and _close(fitted[1], bandwidth)):
            return fail(_diagnose(fitted, n, alpha, bandwidth))
    return ok(
        "PASS: your fit gives α and B back from ring all-reduce times at 4, 3 and "
        "2 ranks, for two different links."
    )
