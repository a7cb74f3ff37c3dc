"""Tests for multigpu.core.checks: each bad value gets one clear message."""

import pytest

from multigpu.core.checks import check_choice, check_number, check_positive_int


@pytest.mark.parametrize("value", [1, 7])
def test_positive_int_passes_through(value):
    assert check_positive_int("steps", value) == value


@pytest.mark.parametrize(
    "value,message",
    [
        (
            0,
            "steps must be an integer of at least 1, got 0. Pass a whole number of "
            "type int, e.g. steps=1 or more.",
        ),
        (
            2.0,
            "steps must be an integer of at least 1, got 2.0. Pass a whole number "
            "of type int, e.g. steps=2.",
        ),
        (
            True,
            "steps must be an integer of at least 1, got True. Pass a whole number "
            "of type int, e.g. steps=1 or more.",
        ),
    ],
)
def test_positive_int_message_suggests_a_fix(value, message):
    with pytest.raises(ValueError) as raised:
        check_positive_int("steps", value)
    assert str(raised.value) == message


def test_positive_int_keeps_the_callers_fix():
    with pytest.raises(ValueError) as raised:
        check_positive_int("batch_size", -3, "Pass e.g. batch_size=64.")
    assert str(raised.value) == (
        "batch_size must be an integer of at least 1, got -3. Pass e.g. batch_size=64."
    )


def test_choice():
    assert check_choice("reduction", "average", ("average", "sum")) == "average"
    with pytest.raises(ValueError) as raised:
        check_choice("reduction", "mean", ("average", "sum"))
    assert str(raised.value) == "Unknown reduction 'mean'. Choose one of: average, sum."


def test_number_accepts_ints_and_floats_and_zero_only_when_allowed():
    assert check_number("lr", 1, "fix") == 1
    assert check_number("momentum", 0.0, "fix", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="lr must be positive, got 0. fix"):
        check_number("lr", 0, "fix")
