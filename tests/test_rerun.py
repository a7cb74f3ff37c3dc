"""Learners go back to a cell after running the notebook: Run All, then run every code
cell once more in reverse order (so each cell sees what the cells after it left), in
one kernel, and no cell may fail that is not meant to. A cell meant to fail carries
``# NBVAL_RAISES_EXCEPTION`` (or the ``raises-exception`` tag) and may fail both
times. Slow: each notebook runs twice (``make test`` runs it; ``-k`` picks one)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(
    ROOT.glob("notebooks/solutions/*.ipynb")
)
CELL_TIMEOUT_S = 300


def _meant_to_fail(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    marked = any(
        line.strip().startswith("# NBVAL_RAISES_EXCEPTION")
        for line in cell.source.splitlines()
    )
    return marked or "raises-exception" in tags


def _error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output['ename']}: {output['evalue']}"
    return None


def unexpected_failures(path: Path) -> list[str]:
    """Run All on ``path``, then each code cell again in reverse order; return one
    line per cell that failed without being meant to, saying which pass."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    failures = []
    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    with client.setup_kernel(env=dict(os.environ)):
        for passname, order in (("Run All", code), ("re-run", code[::-1])):
            for index in order:
                cell = notebook.cells[index]
                client.execute_cell(cell, index)
                error = _error(cell)
                if error and not _meant_to_fail(cell):
                    failures.append(f"{passname}, cell {index}: {error}")
    return failures


def test_the_check_sees_a_cell_that_fails_only_when_run_again(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("items = [1, 2]"),
        nbformat.v4.new_code_cell("first = items.pop(0)\nprint(first)"),
        nbformat.v4.new_code_cell(
            "# NBVAL_RAISES_EXCEPTION\nraise ValueError('shown')"
        ),
        nbformat.v4.new_code_cell("items.clear()"),
    ]
    path = tmp_path / "example.ipynb"
    nbformat.write(notebook, path)
    assert unexpected_failures(path) == [
        "re-run, cell 1: IndexError: pop from empty list"
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_runs_again_after_run_all(path):
    assert unexpected_failures(path) == []
