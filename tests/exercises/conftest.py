"""Every FAIL message a checker gives in these tests names the mistake, never the fix,
and every checker returns an ``ExerciseResult``.

Before the test modules import them, every ``check_*`` function of
``multigpu.exercises`` is wrapped: its result must be an ``ExerciseResult``, and when
it is a FAIL, the message must not contain a piece of code from the reference
solutions (the source of every module of ``multigpu`` outside the checkers, and the
solution notebooks). A learner who reads ``torch.arange(rank, len(y), world_size)``
in a FAIL has been given the answer.

A piece of code is a backticked span, a call with its arguments or an indexing
expression, at least ``MIN_CODE`` characters long once spaces are removed; a bare
name (``set_epoch``) or a call without arguments (``optimizer.step()``) may be
named, as where to look.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import multigpu
import multigpu.exercises
from multigpu.exercises import ExerciseResult
from tests.exercises.checkers import exercise_checkers

MIN_CODE = 12
SOLUTIONS = Path(__file__).resolve().parents[2] / "notebooks" / "solutions"
CODE = re.compile(
    r"`([^`]+)`"  # a backticked span
    r"|([\w.]+\([^()]*(?:\([^()]*\)[^()]*)*\))"  # a call with its arguments
    r"|([\w.]+\[[^\]]+\])"  # an index or a slice
)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@functools.cache
def reference_source() -> str:
    """The source of every module of multigpu but the checkers, and the code of the
    solution notebooks, without spaces."""
    parts = [
        "".join(cell["source"])
        for path in sorted(SOLUTIONS.glob("*.ipynb"))
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if cell["cell_type"] == "code"
    ]
    for info in pkgutil.walk_packages(multigpu.__path__, "multigpu."):
        if info.name.startswith(("multigpu.exercises", "multigpu.doctor")):
            continue
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
            parts.append(inspect.getsource(module))
        except (ImportError, OSError, TypeError):
            continue
    return _squash("\n".join(parts))


def code_in(message: str) -> list[str]:
    """The pieces of code in ``message`` long enough to be a fix; a call without
    arguments (``optimizer.step()``) names where to look and is not one."""
    pieces = [
        next(group for group in m.groups() if group) for m in CODE.finditer(message)
    ]
    return [
        piece
        for piece in pieces
        if len(_squash(piece)) >= MIN_CODE and not re.fullmatch(r"[\w.]+\(\)", piece)
    ]


def reference_code_in(message: str) -> list[str]:
    """The pieces of code in ``message`` that the reference solutions contain."""
    source = reference_source()
    return [piece for piece in code_in(message) if _squash(piece) in source]


def _checked(checker):
    @functools.wraps(checker)
    def wrapper(*args, **kwargs):
        result = checker(*args, **kwargs)
        assert isinstance(result, ExerciseResult), (
            f"{checker.__name__} returned {type(result).__name__}, not an "
            "ExerciseResult: return ok(message) or fail(message)"
        )
        passed, message = result
        if not passed:
            given = reference_code_in(message)
            assert not given, (
                f"{checker.__name__}'s FAIL gives the reference's code {given}: "
                f"name the mistake, not the fix. Message: {message}"
            )
        return result

    return wrapper


def _wrap_every_checker() -> None:
    for module, name, function in exercise_checkers():
        if not hasattr(function, "__wrapped__"):
            setattr(module, name, _checked(function))


_wrap_every_checker()
