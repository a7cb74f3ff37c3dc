"""check_fit (12): right fits pass; each mistake in the ring model is named."""

import pytest

from multigpu import costmodel
from multigpu.exercises.scaling import check_fit, ring_times
from tests.exercises import wrong_scaling


def test_ring_times_follow_the_ring_model():
    (row,) = ring_times(4, 10e-6, 1e9, sizes=[1 << 20])
    assert row == {
        "bytes": 1 << 20,
        "world_size": 4,
        "seconds": 6 * 10e-6 + 1.5e-3 * 1.048576,
    }
    alpha, bandwidth = costmodel.fit_alpha_beta(ring_times(3, 10e-6, 2e9))
    assert alpha == pytest.approx(10e-6, rel=1e-9)
    assert bandwidth == pytest.approx(2e9, rel=1e-9)


@pytest.mark.parametrize(
    "fit",
    [
        wrong_scaling.right,
        wrong_scaling.right_by_normal_equations,
        costmodel.fit_alpha_beta,
    ],
    ids=["lstsq", "normal equations", "the course's"],
)
def test_right_fits_pass(fit):
    passed, message = check_fit(fit)
    assert passed, message
    assert message == (
        "PASS: your fit gives α and B back from ring all-reduce times at 4, 3 and 2 "
        "ranks, for two different links."
    )


HEAD = "FAIL: on times made with α = 30 µs and B = 5 GB/s at 4 ranks, your fit gives "


@pytest.mark.parametrize(
    ("fit", "expected"),
    [
        (
            wrong_scaling.one_message,
            "your α is the latency of the whole all-reduce, not of one message: "
            "each of the ring's messages pays α.",
        ),
        (
            wrong_scaling.one_phase_of_messages,
            "your α is twice too large: the ring's two phases (reduce-scatter, then "
            "all-gather) send n-1 messages each.",
        ),
        (
            wrong_scaling.whole_tensor,
            "your B assumes each rank sends the whole tensor S once; in the ring each "
            "sends its chunks in both phases, a share of S that depends on n.",
        ),
        (
            wrong_scaling.one_phase_of_bytes,
            "your B is half the true one: you counted the bytes of one phase of the "
            "ring, and both phases send as many.",
        ),
        (wrong_scaling.swapped, "the two are swapped. Return (α, B), in that order."),
        (
            wrong_scaling.beta,
            "your second number is seconds per byte (β = 1/B); the fit returns B, "
            "bytes per second.",
        ),
        (wrong_scaling.float32, "beyond float32's 7 digits: check the precision"),
        (
            wrong_scaling.no_model_at_all,
            "must give α and B back exactly: check the model's two columns",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", "message"),
)
def test_each_mistake_is_named(fit, expected):
    passed, message = check_fit(fit)
    assert not passed
    assert message.startswith(HEAD), message
    assert expected in message, message


def test_an_error_in_the_fit_is_a_fail_not_a_traceback():
    passed, message = check_fit(wrong_scaling.indexes_a_list)
    assert not passed
    assert message.startswith("FAIL: your fit raised KeyError on 4 rows at 4 ranks: 2.")
    passed, message = check_fit(lambda rows: (float("nan"), 1.0))
    assert message == (
        "FAIL: your fit returned (nan, 1.0) at 4 ranks: α and B must be finite numbers."
    )
