"""Every exercise checker returns one result type, ``ExerciseResult``: a
``(passed, message)`` tuple, so ``passed, message = check_...(...)`` and
``check_...(...)[1]`` keep working in every notebook."""

import inspect
import typing

from multigpu.exercises import ExerciseResult
from multigpu.exercises.dataparallel import check_scatter
from tests.exercises import wrong_dataparallel as wrong
from tests.exercises.checkers import exercise_checkers


def _checkers():
    for module, name, function in exercise_checkers():
        short = module.__name__.rpartition(".")[2]
        yield f"{short}.{name}", inspect.unwrap(function)


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
