"""What every exercise checker returns: one small result type, still a tuple, so
``passed, message = check_...(...)`` unpacks it as every notebook does."""

from __future__ import annotations

from typing import NamedTuple


class ExerciseResult(NamedTuple):
    """What an exercise checker found (00-16): ``passed``, and ``message``, which
    starts with "PASS:" or "FAIL:" and names the mistake in the learner's words.
    A tuple: ``passed, message = check_scatter(my_scatter)`` unpacks it and
    ``check_scatter(my_scatter)[1]`` is the message."""

    passed: bool
    message: str


def ok(message: str) -> ExerciseResult:
    """The learner's code does what the exercise asks; ``message`` says what was
    checked (00-16)."""
    return ExerciseResult(True, message)


def fail(message: str) -> ExerciseResult:
    """The learner's code has a mistake; ``message`` names it (00-16)."""
    return ExerciseResult(False, message)
