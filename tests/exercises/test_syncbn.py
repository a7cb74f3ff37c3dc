"""The checker of notebook 09b's SyncBatchNorm exercise (multigpu.exercises.syncbn):
it passes the stable combination and names each mistake."""

import pytest
import torch

from multigpu.exercises.syncbn import check_combine, per_rank_statistics


def combine(counts, means, m2s):
    """Right: Chan's combination of the ranks' counts, means and M2."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    return mean, (m2s + counts[:, None] * (means - mean) ** 2).sum(0) / n


def combine_mean_of_means(counts, means, m2s):
    """Mistake: every rank's mean weighs the same."""
    mean = means.mean(0)
    return mean, (m2s + counts[:, None] * (means - mean) ** 2).sum(0) / counts.sum()


def combine_squares(counts, means, m2s):
    """Mistake: E[x²] - mean², which cancels in float32 around 1e4."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    squares = (m2s + counts[:, None] * means**2).sum(0) / n
    return mean, squares - mean**2


def combine_unbiased(counts, means, m2s):
    """Mistake: divides by N - 1."""
    mean, var = combine(counts, means, m2s)
    n = counts.sum()
    return mean, var * n / (n - 1)


def combine_within_only(counts, means, m2s):
    """Mistake: forgets the spread of the means between the ranks."""
    mean, _ = combine(counts, means, m2s)
    return mean, m2s.sum(0) / counts.sum()


def combine_per_rank_variance(counts, means, m2s):
    """Mistake: each rank's variance M2 / count first: 0 / 0 for the empty rank."""
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    variances = m2s / counts[:, None]
    return mean, (counts[:, None] * (variances + (means - mean) ** 2)).sum(0) / n


def combine_in_float64(counts, means, m2s):
    """Right too: the same combination in float64, skipping empty ranks, returned
    in the input's dtype."""
    keep = counts > 0
    counts, means, m2s = counts[keep].double(), means[keep].double(), m2s[keep].double()
    mean, var = combine(counts, means, m2s)
    return mean.to(m2s.dtype), var


@pytest.mark.parametrize("right", [combine, combine_in_float64])
def test_check_combine_passes_right_combinations(right):
    assert check_combine(right) == (
        True,
        "PASS: the global mean and biased variance, with ranks of 5, 0 and 11 "
        "samples, in float64 and in float32 around 1e4.",
    )


@pytest.mark.parametrize(
    ("wrong", "start"),
    [
        (combine_mean_of_means, "FAIL: the mean is not the global batch's"),
        (combine_squares, "FAIL: right in float64, but in float32"),
        (
            combine_unbiased,
            "FAIL: your variance divides by N - 1 (unbiased), but BatchNorm",
        ),
        (combine_within_only, "FAIL: your variance adds only each rank's M2"),
        (
            combine_per_rank_variance,
            "FAIL: your variance is NaN: the rank with 0 samples divides by its "
            "count of 0 (0 / 0 is NaN)",
        ),
    ],
)
def test_check_combine_names_each_mistake(wrong, start):
    passed, message = check_combine(wrong)
    assert not passed
    assert message.startswith(start), message


def test_per_rank_statistics_of_an_empty_rank_are_zero():
    counts, means, m2s = per_rank_statistics([torch.ones(2, 3), torch.ones(0, 3)])
    assert counts.tolist() == [2.0, 0.0]
    assert means[1].tolist() == [0.0, 0.0, 0.0] and m2s[1].tolist() == [0.0] * 3
