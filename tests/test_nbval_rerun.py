"""The re-run check of ``make nbval`` (tests/nbval_rerun.py) on small notebooks: it
finds a cell that fails only when run again after Run All, lets a cell meant to fail
fail both times, and finds nothing without its flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def _run_nbval(path: Path, *flags: str) -> subprocess.CompletedProcess:
    # tests.warm_kernels for its kernels on Unix sockets, cold: a TCP port picked
    # for the kernel could be taken by the other parts of `make test` meanwhile
    command = [
        sys.executable, "-m", "pytest", "-p", "tests.nbval_rerun",
        "-p", "tests.warm_kernels", "-p", "no:cacheprovider", "-p", "no:randomly",
        "-v", "--color=no",
        "--nbval", "--nbval-current-env", *flags, str(path),
    ]  # fmt: skip
    environment = {**os.environ, "MULTIGPU_COLD_KERNELS": "1"}
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )


def _notebook(tmp_path: Path, *sources: str) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    path = tmp_path / "example.ipynb"
    nbformat.write(notebook, path)
    return path


def test_a_cell_that_fails_only_when_run_again_fails_its_re_run(tmp_path):
    path = _notebook(
        tmp_path,
        "items = [1, 2]",
        "first = items.pop(0)\nprint(first)",
        "# NBVAL_RAISES_EXCEPTION\nraise ValueError('shown')",
        "items.clear()",
    )
    collected = _run_nbval(path, "--nbval-rerun", "--collect-only", "-qq")
    order = [
        line.split("::")[1] for line in collected.stdout.splitlines() if "::" in line
    ]
    assert order == [
        "Cell 0", "Cell 1", "Cell 2", "Cell 3",
        "Cell 3 re-run", "Cell 2 re-run", "Cell 1 re-run", "Cell 0 re-run",
    ]  # fmt: skip
    result = _run_nbval(path, "--nbval-rerun")
    assert result.returncode == 1, result.stdout
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "example.ipynb::Cell 1 re-run" in failed[0]
    assert "IndexError" in result.stdout and ": pop from empty list" in result.stdout
    assert "1 failed, 7 passed" in result.stdout


def test_without_the_flag_the_notebook_runs_once(tmp_path):
    path = _notebook(tmp_path, "items = [1, 2]", "items.pop(0)", "items.clear()")
    result = _run_nbval(path)
    assert result.returncode == 0, result.stdout
    assert "re-run" not in result.stdout
    assert "3 passed" in result.stdout


def test_cells_meant_to_fail_and_skipped_cells_pass_their_re_run(tmp_path):
    path = _notebook(
        tmp_path,
        "# NBVAL_RAISES_EXCEPTION\nraise ValueError('shown')",
        "# NBVAL_SKIP\nraise RuntimeError('never run')",
        "x = 1",
    )
    result = _run_nbval(path, "--nbval-rerun")
    assert result.returncode == 0, result.stdout
    assert "4 passed, 2 skipped" in result.stdout
