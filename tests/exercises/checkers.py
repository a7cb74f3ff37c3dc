"""Every exercise checker of the package: the ``check_*`` functions each module of
``multigpu.exercises`` defines (not those it imports)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from types import ModuleType

import multigpu.exercises


def exercise_checkers() -> Iterator[tuple[ModuleType, str, Callable]]:
    """(module, name, function) for every ``check_*`` defined in a public module
    of ``multigpu.exercises``."""
    for info in pkgutil.iter_modules(multigpu.exercises.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"multigpu.exercises.{info.name}")
        for name, function in list(vars(module).items()):
            if (
                name.startswith("check_")
                and inspect.isfunction(function)
                and function.__module__ == module.__name__
            ):
                yield module, name, function
