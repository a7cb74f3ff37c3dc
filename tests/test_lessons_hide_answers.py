"""No lesson prints the answer of its own exercise.

A learner who can copy a printed function into an exercise learns nothing, so a
lesson shows the reference code of an exercise only through its signature and
docstring. Each lesson's row in tests/lessons.py names the package functions that
answer its exercises (``answers``); no code cell of the lesson may print their source.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.lessons import LESSONS

ROOT = Path(__file__).resolve().parents[1]

GETSOURCE = re.compile(r"getsource\(\s*([\w.]+)")


def printed_sources(path: Path) -> list[str]:
    """Every name in the dotted paths whose source a code cell of ``path`` prints
    with inspect.getsource (``C.Ring.forward`` gives C, Ring and forward)."""
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    paths = [found for text in code for found in GETSOURCE.findall(text)]
    return [name for dotted in paths for name in dotted.split(".")]


def test_printed_sources_finds_qualified_and_bare_names(tmp_path):
    cell = (
        "print(inspect.getsource(C.ring_all_reduce))\n"
        "inspect.getsource( sgd_step )\n"
        "inspect.getsource(tp.Row.forward)"
    )
    notebook = {"cells": [{"cell_type": "code", "source": [cell]}]}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(notebook))
    assert printed_sources(path) == [
        "C",
        "ring_all_reduce",
        "sgd_step",
        "tp",
        "Row",
        "forward",
    ]


@pytest.mark.parametrize(
    "lesson",
    [lesson for lesson in LESSONS if lesson.answers],
    ids=lambda lesson: lesson.notebook,
)
def test_no_lesson_prints_its_exercises_answers(lesson):
    path = ROOT / "notebooks" / f"{lesson.notebook}.ipynb"
    shown = sorted(set(printed_sources(path)) & set(lesson.answers))
    assert not shown, f"{path.name} prints the source of {shown}, an exercise's answer"
