"""Tests for multigpu.costmodel.fit: α and B fitted to all-reduce times (12)."""

import pytest

from multigpu import costmodel


def _rows(alpha, bandwidth, noise=0.0):
    rows = []
    for i, (world_size, nbytes) in enumerate(
        (n, s) for n in (2, 4) for s in (4096, 65536, 1 << 20, 4 << 20)
    ):
        exact = costmodel.alpha_beta_time("ring", nbytes, world_size, alpha, bandwidth)
        wobble = noise * (1 if i % 2 else -1)  # deterministic ±noise
        rows.append(
            {"bytes": nbytes, "world_size": world_size, "seconds": exact * (1 + wobble)}
        )
    return rows


@pytest.mark.parametrize("alpha, bandwidth", [(5e-5, 2e9), (1e-6, 1e11), (3e-4, 5e8)])
def test_fit_recovers_alpha_and_bandwidth_from_synthetic_times(alpha, bandwidth):
    fitted_alpha, fitted_bandwidth = costmodel.fit_alpha_beta(_rows(alpha, bandwidth))
    assert fitted_alpha == pytest.approx(alpha, rel=1e-9)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-9)
    # 2 % noise moves the fit by a few per cent, not by orders of magnitude
    noisy_alpha, noisy_bandwidth = costmodel.fit_alpha_beta(
        _rows(alpha, bandwidth, 0.02)
    )
    assert noisy_alpha == pytest.approx(alpha, rel=0.2)
    assert noisy_bandwidth == pytest.approx(bandwidth, rel=0.1)


def test_fit_refuses_rows_that_cannot_determine_both():
    one_size = [
        r for r in _rows(1e-5, 1e9) if r["bytes"] == 4096 and r["world_size"] == 2
    ]
    with pytest.raises(ValueError, match="at least two different sizes"):
        costmodel.fit_alpha_beta(one_size)
    shrinking = [
        {"bytes": 1 << 20, "world_size": 2, "seconds": 1e-3},
        {"bytes": 4 << 20, "world_size": 2, "seconds": 1e-4},
    ]
    with pytest.raises(ValueError, match="do not grow with the bytes"):
        costmodel.fit_alpha_beta(shrinking)
