"""The test targets' Pythons collect garbage less often, torchrun's agents and ranks
not at all; everything else keeps Python's defaults (tests/startup/sitecustomize.py,
the Makefile's ``TEST_ENV``). And how `make test` starts its pytest parts."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STARTUP = ROOT / "tests" / "startup"
MAKEFILE = (ROOT / "Makefile").read_text()
SHOW_THRESHOLDS = "import gc; print(gc.get_threshold())"


def thresholds(
    pythonpath: str | None, show: str = SHOW_THRESHOLDS, **extra: str
) -> tuple[int, ...]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.update(extra)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", show],
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


def test_torchruns_agents_and_ranks_do_not_collect_at_all():
    show = "import gc; print((gc.isenabled(), *gc.get_threshold()))"
    assert thresholds(str(STARTUP), show, TORCHELASTIC_RUN_ID="run") == (
        False,
        *declared(),
    )
    assert thresholds(str(STARTUP), show) == (True, *declared())
    assert thresholds(None, show, TORCHELASTIC_RUN_ID="run") == (True, 700, 10, 10)


def test_torchruns_agent_is_told_by_its_command_line(monkeypatch):
    """The agent as the course's launcher starts it (python -m torch.distributed.run)
    and as a learner types it (the torchrun script); no other Python."""
    from multigpu.runtime.launch import start_torchrun

    started = []
    monkeypatch.setattr(
        subprocess, "Popen", lambda command, **_: started.append(command)
    )
    start_torchrun("multigpu.ddp", 2, "--epochs", 1)
    monkeypatch.undo()
    (launcher,) = started
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    python = sys.executable
    command_lines = {
        "launcher": launcher,
        "typed": [python, torchrun, "--standalone", "-m", "multigpu.ddp"],
        "options first": [python, "-u", "-m", "torch.distributed.run", "x.py"],
        "pytest": [python, "-m", "pytest", "torch.distributed.run"],
        "a script": [python, "train.py", "torchrun"],
        "code": [python, "-c", "import torch.distributed.run"],
        "a kernel": [python, "-m", "ipykernel_launcher", "-f", "k.json"],
    }
    show = (
        "import json, sys, sitecustomize; print(json.dumps({name: "
        "sitecustomize.torchrun_process(argv, {}) "
        "for name, argv in json.load(sys.stdin).items()}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", show],
        input=json.dumps(command_lines),
        env={**os.environ, "PYTHONPATH": str(STARTUP)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    told = json.loads(out)
    assert told == {
        "launcher": True,
        "typed": True,
        "options first": True,
        "pytest": False,
        "a script": False,
        "code": False,
        "a kernel": False,
    }


def make(*arguments: str) -> str:
    """What ``make --no-print-directory ARGUMENTS`` prints in the project's root."""
    return subprocess.run(
        ["make", "--no-print-directory", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def make_value(variable: str) -> str:
    """The Makefile's ``variable`` as make expands it into a recipe."""
    show = f"show-value:\n\t@echo '$({variable})'"
    return make("-s", "--eval", show, "show-value").strip()


SHOW_TUNABLES = "import os; print(os.environ.get('GLIBC_TUNABLES'))"
HUGE_PAGES_IN_HEAP = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(64 << 20)
ctypes.memset(block, 1, 64 << 20)
smaps = open("/proc/self/smaps_rollup").read().splitlines()
print(next(int(line.split()[1]) for line in smaps if line.startswith("AnonHugePages")))
"""


def run_with_test_env(code: str, test_env: bool = True, **extra: str) -> str:
    """What ``python -c code`` prints, started from a shell with the test targets'
    variables in front of it (or without them), GLIBC_TUNABLES only from ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(extra)
    prefix = make_value("TEST_ENV") if test_env else ""
    command = f"{prefix} {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    return subprocess.run(
        ["sh", "-c", command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_the_test_targets_ask_malloc_for_huge_pages_and_keep_other_tunables():
    assert run_with_test_env(SHOW_TUNABLES) == "glibc.malloc.hugetlb=1"
    kept = run_with_test_env(SHOW_TUNABLES, GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert kept == "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=2"


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not THP.exists()
    or "[never]" in THP.read_text(),
    reason="the kernel grants no transparent huge pages here",
)
def test_a_test_python_s_heap_lies_in_huge_pages_where_the_kernel_grants_them():
    heap_kib = int(run_with_test_env(HUGE_PAGES_IN_HEAP))
    if "[always]" not in THP.read_text():  # "madvise": only where malloc asks
        plain = run_with_test_env(HUGE_PAGES_IN_HEAP, test_env=False)
        assert int(plain) == 0
    assert heap_kib >= 32 << 10, heap_kib


def test_the_tests_marked_alone_run_first_and_no_part_runs_them_again():
    """`make test` runs the tests marked `alone` (real launches against the
    doctor's limits in seconds) before its parts, on their own: each must lie where
    `pytest-alone` looks, and every part must leave them out."""
    folders = [ROOT / folder for folder in make_value("ALONE_TESTS").split()]
    marked = [
        path
        for path in (ROOT / "tests").rglob("test_*.py")
        if path != Path(__file__).resolve()
        and "@pytest.mark.alone" in path.read_text(encoding="utf-8")
    ]
    assert marked, "no test is marked alone"
    for path in marked:
        assert any(path.is_relative_to(folder) for folder in folders), path
    assert "-m alone $(ALONE_TESTS)" in recipe("pytest-alone")
    assert make_value("NOT_ALONE") == '-m "not alone"'
    for part in make_value("PYTEST_PARTS").split():
        assert "$(NOT_ALONE)" in recipe(part), part
    assert re.search(r"^test:.* pytest-alone\b", MAKEFILE, re.M)


def pytest_command(part: str) -> list[str]:
    """The arguments `make` gives pytest in ``part``'s recipe, as it expands them."""
    [line] = [line for line in make("-n", part).splitlines() if "/pytest " in line]
    return shlex.split(line.split("/pytest ", 1)[1])


def test_every_test_file_runs_in_exactly_one_pytest_part():
    """`make test`'s pytest parts, as make expands their recipes, together collect
    every test file once: a folder added to one part's list must leave the rest."""
    files = [
        path.relative_to(ROOT) for path in sorted((ROOT / "tests").rglob("test_*.py"))
    ]
    parts: dict[Path, list[str]] = {path: [] for path in files}
    for part in make_value("PYTEST_PARTS").split():
        arguments = pytest_command(part)
        named = [Path(a) for a in arguments if a.startswith("tests")]
        ignored = [
            Path(a.split("=", 1)[1]) for a in arguments if a.startswith("--ignore=")
        ]
        assert named, part
        for path in files:
            if any(path.is_relative_to(folder) for folder in named) and not any(
                path.is_relative_to(folder) for folder in ignored
            ):
                parts[path].append(part)
    assert {path: seen for path, seen in parts.items() if len(seen) != 1} == {}
    assert "$(PYTEST_PARTS)" in recipe("test")
