"""Every exercise checker returns one result type, ``ExerciseResult``: a
``(passed, message)`` tuple, so ``passed, message = check_...(...)`` and
``check_...(...)[1]`` keep working in every notebook."""

import importlib
import inspect
import pkgutil
import typing

import multigpu.exercises
from multigpu.exercises import ExerciseResult
from multigpu.exercises.dataparallel import check_scatter
from tests.exercises import wrong_dataparallel as wrong


def _checkers():
    for info in pkgutil.iter_modules(multigpu.exercises.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"multigpu.exercises.{info.name}")
        for name, function in vars(module).items():
            if (
                name.startswith("check_")
                and inspect.isfunction(function)
                and function.__module__ == module.__name__
            ):
                yield f"{info.name}.{name}", inspect.unwrap(function)


def test_every_checker_declares_the_one_result_type():
    checkers = dict(_checkers())
    assert len(checkers) >= 19  # every lesson's checkers, 00 to 16
    declared = {
        name: typing.get_type_hints(function).get("return")
        for name, function in checkers.items()
    }
    assert {n: t for n, t in declared.items() if t is not ExerciseResult} == {}


def test_a_result_unpacks_and_indexes_as_the_notebooks_use_it():
    result = check_scatter(wrong.round_robin)  # a FAIL, found without launching
    assert isinstance(result, ExerciseResult)
    passed, message = result
    assert (passed, message) == (result.passed, result.message) == tuple(result)
    assert not passed and message.startswith("FAIL: ")
    assert result[1] == message
