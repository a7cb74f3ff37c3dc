"""Fitting the ring's α (latency per message) and B (bandwidth) to measured
all-reduce times (12)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multigpu.costmodel.communication import ring_bytes_theory


def fit_alpha_beta(rows: Iterable[Mapping[str, float]]) -> tuple[float, float]:
    """α (seconds per message) and B (bytes/s) of the ring model
    t = 2(n-1)·α + 2(n-1)/n·S/B, fitted by least squares in relative error to
    measured rows with "bytes", "world_size" and "seconds" (as
    ``multigpu.ranks.collectives.time_all_reduces_rank`` returns them) (12).

    Raises ValueError when the rows cannot determine both (fewer than two distinct
    points, or a fit that needs a negative latency or bandwidth cost, which means
    the times do not grow with the bytes)."""
    points = [
        (
            2.0 * (row["world_size"] - 1),
            ring_bytes_theory(row["bytes"], int(row["world_size"])),
            row["seconds"],
        )
        for row in rows
        if row["world_size"] > 1
    ]
    if any(t <= 0 for _, _, t in points):
        raise ValueError("fit_alpha_beta needs measured times above zero seconds.")
    if len({(steps, sent) for steps, sent, _ in points}) < 2:
        raise ValueError(
            "fit_alpha_beta needs all-reduce times for at least two different sizes "
            f"(or world sizes) with 2 or more ranks; got {len(points)} usable rows. "
            "Measure a few sizes, for example 4 KiB to 4 MiB."
        )
    # Normal equations of the two-parameter fit t = steps·α + sent·(1/B), each row
    # weighted by 1/t², so that the error counted is relative: times that span
    # three orders of magnitude all count, not only the largest.
    weights = [1.0 / t**2 for _, _, t in points]
    saa = sum(w * a * a for w, (a, _, _) in zip(weights, points))
    sab = sum(w * a * b for w, (a, b, _) in zip(weights, points))
    sbb = sum(w * b * b for w, (_, b, _) in zip(weights, points))
    sat = sum(w * a * t for w, (a, _, t) in zip(weights, points))
    sbt = sum(w * b * t for w, (_, b, t) in zip(weights, points))
    det = saa * sbb - sab * sab
    if det == 0:
        raise ValueError(
            "fit_alpha_beta cannot tell latency from bandwidth: every row sends "
            "the same bytes per message. Measure several tensor sizes."
        )
    alpha = (sat * sbb - sbt * sab) / det
    inverse_bandwidth = (saa * sbt - sab * sat) / det
    if alpha < 0 or inverse_bandwidth <= 0:
        raise ValueError(
            f"The fit gives α = {alpha:.3g} s and 1/B = {inverse_bandwidth:.3g} s/B: "
            "the times do not grow with the bytes as the α-β model assumes. "
            "Measure larger tensors (up to a few MiB) or repeat the measurement on "
            "a quieter machine."
        )
    return alpha, 1.0 / inverse_bandwidth
