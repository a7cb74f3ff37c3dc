"""The test targets' Pythons collect garbage less often; everything else keeps
Python's defaults (tests/startup/sitecustomize.py, the Makefile's ``TEST_ENV``)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTUP = ROOT / "tests" / "startup"
MAKEFILE = (ROOT / "Makefile").read_text()
SHOW_THRESHOLDS = "import gc; print(gc.get_threshold())"


def thresholds(pythonpath: str | None) -> tuple[int, ...]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", SHOW_THRESHOLDS],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return ast.literal_eval(out.strip())


def declared() -> tuple[int, ...]:
    tree = ast.parse((STARTUP / "sitecustomize.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "THRESHOLDS":
            return ast.literal_eval(node.value)
    raise AssertionError("tests/startup/sitecustomize.py sets no THRESHOLDS")


def recipe(target: str) -> str:
    """The recipe of ``target`` ("" for a target made of others)."""
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", MAKEFILE, re.M)
    assert match, f"no target {target} in the Makefile"
    return match.group(1)


def test_a_python_started_with_the_folder_on_its_path_collects_less_often():
    assert thresholds(str(STARTUP)) == declared()
    assert thresholds(os.pathsep.join([str(STARTUP), "/elsewhere"])) == declared()


def test_a_python_started_without_it_keeps_the_defaults():
    assert thresholds(None) == (700, 10, 10) != declared()


def test_the_test_targets_use_it_and_the_stored_outputs_do_not():
    assert str(STARTUP.relative_to(ROOT)) in MAKEFILE
    parts = re.findall(r"^((?:pytest|nbval)[-\w]*):", MAKEFILE, re.M)
    running = [
        t
        for t in [*parts, "test-slow"]
        if "-m pytest" in recipe(t) or "/pytest" in recipe(t)
    ]
    assert len(running) >= 10, running
    for target in running:
        assert "$(TEST_ENV)" in recipe(target), target
    for target in ["notebooks", "run", "lab"]:
        assert "$(TEST_ENV)" not in recipe(target), target
