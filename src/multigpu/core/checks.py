"""Argument checks shared by the modules: one sentence on what is wrong, one on how
to fix it."""

from __future__ import annotations

import math
from numbers import Real

__all__ = ["check_choice", "check_number", "check_positive_int"]


def check_positive_int(name: str, value: object, how_to_fix: str | None = None) -> int:
    """Return ``value`` if it is an ``int`` of at least 1 (not a bool), else raise
    ``ValueError`` naming ``name``, followed by ``how_to_fix``.

    Without ``how_to_fix`` the message suggests a whole number, e.g. ``steps=20``
    for ``steps=20.0``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if how_to_fix is None:
            whole = isinstance(value, float) and value.is_integer() and value >= 1
            example = f"{name}={int(value)}" if whole else f"{name}=1 or more"
            how_to_fix = f"Pass a whole number of type int, e.g. {example}."
        raise ValueError(
            f"{name} must be an integer of at least 1, got {value!r}. {how_to_fix}"
        )
    return value


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError``
    listing them."""
    if value not in choices:
        raise ValueError(
            f"Unknown {what} {value!r}. Choose one of: {', '.join(choices)}."
        )
    return value


def check_number(
    name: str, value: object, how_to_fix: str, *, allow_zero: bool = False
) -> float:
    """Return ``value`` if it is a finite real number above 0 (or at least 0 with
    ``allow_zero``), else raise naming ``name``, followed by ``how_to_fix``.

    A string such as ``"0.1"`` or a bool is a ``TypeError``; nan, infinity and an
    out-of-range number are a ``ValueError``.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(
            f"{name} must be a number, got {value!r} ({type(value).__name__}). "
            f"{how_to_fix}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}. {how_to_fix}")
    if value < 0 or (value == 0 and not allow_zero):
        rule = "must not be negative" if allow_zero else "must be positive"
        raise ValueError(f"{name} {rule}, got {value!r}. {how_to_fix}")
    return value
