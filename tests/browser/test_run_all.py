"""Each lesson notebook, run with JupyterLab's own Run All in headless Chromium,
raises only the errors it demonstrates and prints what it stores, as nbval checks it
(``make test-browser``; skipped without selenium, Chromium or chromedriver)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

pytest.importorskip(
    "selenium", reason="selenium is not installed (`make test-browser` installs it)"
)

from tests.browser.lab import ROOT  # noqa: E402
from tests.browser.outputs import notebook_problems, read_patterns  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
PATTERNS = read_patterns(ROOT / "tests" / "nbval_sanitize.cfg")
# Run All's limit for one notebook (the slowest takes about a minute on 2 cores).
TIMEOUT = float(os.environ.get("MULTIGPU_BROWSER_TIMEOUT", "900"))


def test_the_kernel_is_this_environment(lab_server):
    python = lab_server.kernel_python()
    # jupyter_client starts a bare "python" as the server's own interpreter.
    if python not in ("python", "python3"):
        assert Path(python).parent == Path(sys.executable).parent, python


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_run_all_matches_the_stored_outputs(
    path, lab, lab_server, browser_results, tmp_path
):
    """Run All's seconds (from the command to the idle kernel) go to the table that
    closes the run; a run that breaks leaves a screenshot in ``tmp_path``."""
    start, result = None, "error"
    try:
        lab.open(path.name)
        start = time.monotonic()
        seconds = lab.run_all(timeout=TIMEOUT)
        lab.save_and_close()
        executed = lab_server.read_notebook(path.name)
        problems = notebook_problems(executed, nbformat.read(path, 4), PATTERNS)
        result = f"FAIL: {len(problems)} problem(s)" if problems else "pass"
    except Exception:
        seconds = time.monotonic() - start if start else 0.0
        screenshot = tmp_path / f"{path.stem}.png"
        with contextlib.suppress(Exception):  # keep the error that happened
            lab.screenshot(screenshot)
            lab_server.shutdown_kernels()
        result = f"error (screenshot {screenshot})"
        raise
    finally:
        browser_results.append((path.stem, seconds, result))
    assert not problems, f"{path.name}:\n" + "\n\n".join(problems)
