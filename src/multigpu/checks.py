"""Argument checks shared by the modules: one sentence on what is wrong, one on how
to fix it."""

from __future__ import annotations

__all__ = ["check_choice", "check_positive_int"]


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
