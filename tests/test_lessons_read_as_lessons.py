"""Every notebook reads as a lesson, not as its own test harness.

The rules of docs/notebooks.md that a program can check, on every notebook
(lessons and solutions):

- nbval's markers are cell tags, never a first-line comment a learner reads first;
- no markdown cell is longer than 250 words, and "What you will see" is short;
- the markdown never speaks to maintainers (paths under tests/ and bench/, nbval, CI,
  the MULTIGPU_* switches, pytest): what a maintainer needs is in docs/;
- a lesson's first code cell is short, and a comment above each magic in it says
  what the magic is for;
- a deep dive sits in the last section, "Under the hood", after the exercises.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(ROOT.glob("notebooks/[0-9]*.ipynb"))
NOTEBOOKS = LESSONS + sorted(ROOT.glob("notebooks/solutions/[0-9]*.ipynb"))

NBVAL_TAGS = {"nbval-ignore-output", "nbval-skip", "raises-exception"}
MARKER_COMMENT = re.compile(r"^\s*#\s*(NBVAL|PYTEST_VALIDATE)_\w+", re.MULTILINE)
MAINTAINER_WORDS = re.compile(
    r"\btests?/|\bbench/|nbval|\bCI\b|MULTIGPU_[A-Z_]+|pytest|\bthe tests\b", re.I
)
FENCED = re.compile(r"```.*?```", re.DOTALL)
MAX_WORDS = 250
MAX_SEE_WORDS = 130  # "What you will see": about 120 words
MAX_FIRST_CELL_LINES = 25


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def words(markdown: str) -> int:
    """Words a learner reads: fenced code blocks are not prose."""
    return len(FENCED.sub(" ", markdown).split())


def ids(path: Path) -> str:
    return path.name


def test_there_are_notebooks():
    assert len(LESSONS) >= 19 and len(NOTEBOOKS) >= 38


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_nbval_markers_are_cell_tags(path):
    found = [
        index
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "code" and MARKER_COMMENT.search(text(cell))
    ]
    assert not found, (
        f"{path.name}: cells {found} carry an nbval marker as a comment; use the "
        "cell tag instead (nbval-ignore-output, nbval-skip, raises-exception)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_only_known_nbval_tags(path):
    for index, cell in enumerate(cells(path)):
        tags = set(cell.get("metadata", {}).get("tags", []))
        nbval_like = {tag for tag in tags if "nbval" in tag or "exception" in tag}
        assert nbval_like <= NBVAL_TAGS, f"{path.name} [{index}]: {nbval_like}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_markdown_cell_is_longer_than_250_words(path):
    long = {
        index: words(text(cell))
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "markdown" and words(text(cell)) > MAX_WORDS
    }
    assert not long, f"{path.name}: markdown cells over {MAX_WORDS} words {long}"


@pytest.mark.parametrize("path", LESSONS, ids=ids)
def test_what_you_will_see_is_short(path):
    intro = text(cells(path)[0])
    assert "**What you will see**" in intro, f"{path.name}: no 'What you will see'"
    see = intro.split("**What you will see**", 1)[1]
    assert words(see) <= MAX_SEE_WORDS, f"{path.name}: {words(see)} words"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_markdown_never_speaks_to_maintainers(path):
    found = [
        (index, match.group())
        for index, cell in enumerate(cells(path))
        if cell["cell_type"] == "markdown"
        for match in MAINTAINER_WORDS.finditer(text(cell))
    ]
    assert not found, f"{path.name}: maintainer words in markdown {found}"


@pytest.mark.parametrize("path", LESSONS, ids=ids)
def test_the_first_code_cell_is_short_and_says_what_its_magics_do(path):
    first = next(text(cell) for cell in cells(path) if cell["cell_type"] == "code")
    lines = [line for line in first.splitlines() if line.strip()]
    assert len(lines) <= MAX_FIRST_CELL_LINES, f"{path.name}: {len(lines)} lines"
    unexplained = [
        line
        for above, line in zip(["", *lines], lines)
        if line.startswith("%") and not above.lstrip().startswith("#")
    ]
    assert not unexplained, f"{path.name}: magics without a comment {unexplained}"


@pytest.mark.parametrize("path", LESSONS, ids=ids)
def test_under_the_hood_is_the_last_section(path):
    headings = [
        line
        for cell in cells(path)
        if cell["cell_type"] == "markdown"
        for line in text(cell).splitlines()
        if line.startswith("## ")
    ]
    hood = [index for index, line in enumerate(headings) if "Under the hood" in line]
    assert not hood or hood == [len(headings) - 1], (
        f"{path.name}: 'Under the hood' must be the one last section: {headings}"
    )


def test_the_rules_catch_what_they_forbid():
    assert MARKER_COMMENT.search("x = 1\n# NBVAL_SKIP\n")
    assert not MARKER_COMMENT.search("print('NBVAL_SKIP')")
    for said in ("see tests/ddp/", "bench/x.py", "nbval ignores", "set MULTIGPU_SLOW"):
        assert MAINTAINER_WORDS.search(said), said
    assert not MAINTAINER_WORDS.search("the test set; a critical step; contests")
    assert words("one two\n```\nthree four five\n```\nsix") == 3
