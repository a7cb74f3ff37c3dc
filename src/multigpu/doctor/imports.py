"""Import the packages for real, in a child process with a time limit.

A package whose files and version are in place can still fail to import: a broken
install, or a folder or file of the same name that Python finds first (``numpy/`` in
the working folder or on ``PYTHONPATH``). The child imports each package and says
which failed, with the error and where Python found the package; a package that
hangs or crashes the child is named too. Checks that need a package in this process
(torch for the GPUs and the launches) ask :func:`not_importable` first, so that a
broken torch is a ✗ line, never a traceback.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from multigpu.doctor.result import CheckResult, fail

# The packages the notebooks import, and those JupyterLab needs to run them (the
# `packages` check compares their versions too: environment).
NEEDED = ("torch", "torchvision", "numpy", "matplotlib", "tqdm")
NEEDED_FOR_LAB = ("jupyterlab", "ipykernel", "jupyter_client")
IMPORT_TIMEOUT_S = 90.0  # torch, torchvision and jupyterlab: 3-10 s on a laptop
MARK = "multigpu-doctor-import "  # the child's result lines start with it
CHILD = """
import importlib, importlib.util, json, sys, traceback
mark, *names = sys.argv[1:]
for name in names:
    error = where = origin = None
    try:
        importlib.import_module(name)
    except BaseException as exc:
        lines = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        frames = traceback.extract_tb(exc.__traceback__)
        where = frames[-1].filename if frames else None
        try:
            origin = importlib.util.find_spec(name).origin
        except BaseException:
            pass
    found = {"name": name, "error": error, "where": where, "origin": origin}
    print(mark + json.dumps(found), flush=True)
"""


@dataclass(frozen=True)
class ImportProblem:
    """``name`` did not import: ``error`` (``"ImportError: ..."``, one line),
    ``where`` (the file that raised it) and ``origin`` (where Python found the
    package), each None where unknown."""

    name: str
    error: str
    where: str | None = None
    origin: str | None = None


def import_packages(
    names: Sequence[str], timeout: float = IMPORT_TIMEOUT_S
) -> dict[str, ImportProblem]:
    """Import ``names`` one after the other in a child Python (this interpreter,
    this environment, this working folder); return the ones that failed. The child
    is stopped after ``timeout`` seconds: the package it was importing then fails."""
    command = [sys.executable, "-c", CHILD, MARK, *names]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
        output, stopped, code = done.stdout, None, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        stopped, code = f"did not finish importing within {timeout:g} s", 0
    except OSError as exc:  # no Python to start
        error = f"{type(exc).__name__}: {exc}"
        return {name: ImportProblem(name, error) for name in names}
    problems, reported = {}, set()
    for line in output.splitlines():
        if line.startswith(MARK):
            found = json.loads(line[len(MARK) :])
            reported.add(found["name"])
            if found["error"] is not None:
                problems[found["name"]] = ImportProblem(
                    found["name"], found["error"], found["where"], found["origin"]
                )
    unreported = [name for name in names if name not in reported]
    if unreported:  # the child hung or died while importing the first of them
        if stopped is None and code < 0:
            stopped = f"the Python importing it was killed by {_signal_name(-code)}"
        elif stopped is None:
            stopped = f"the Python importing it ended with exit code {code}"
        problems[unreported[0]] = ImportProblem(unreported[0], stopped)
    return problems


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


_lock = threading.Lock()
_found: dict[str, ImportProblem] | None = None


def import_problems() -> dict[str, ImportProblem]:
    """:func:`import_packages` of NEEDED and NEEDED_FOR_LAB, run once per process:
    the checks that ask again (from other threads too) get the same answer."""
    global _found
    with _lock:
        if _found is None:
            _found = import_packages((*NEEDED, *NEEDED_FOR_LAB))
        return _found


def import_error(
    name: str, problems: Callable[[], Mapping[str, ImportProblem]] = import_problems
) -> str | None:
    """Why ``name`` does not import (the child's verdict), None if it does; a
    package this process has imported already does."""
    if name in sys.modules:
        return None
    problem = problems().get(name)
    return None if problem is None else problem.error


def not_importable(
    check: str,
    name: str,
    problems: Callable[[], Mapping[str, ImportProblem]] = import_problems,
) -> CheckResult | None:
    """A failure of ``check`` when ``name`` does not import, else None."""
    error = import_error(name, problems)
    if error is None:
        return None
    return fail(
        check,
        f"not checked: {name} does not import ({error})",
        "do the fix of `packages` above, then run the doctor again",
    )


def _environment_folders() -> list[Path]:
    """The folders of this environment's installed packages and standard library."""
    names = ("purelib", "platlib", "stdlib", "platstdlib")
    return [Path(sysconfig.get_paths()[name]).resolve() for name in names]


def _inside(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder)


def _search_entry(path: str) -> Path | None:
    """The entry of Python's search path (the working folder for "") that holds
    ``path``, the deepest one if several do."""
    entries = [Path(entry or ".").resolve() for entry in sys.path]
    holding = [entry for entry in entries if _inside(path, entry)]
    return max(holding, key=lambda entry: len(entry.parts), default=None)


def shadow(problem: ImportProblem) -> tuple[str, str, str] | None:
    """``(path, package, how)``: the file or folder at ``path`` hides the installed
    ``package``, found ``how`` ("in the working folder", "on PYTHONPATH"), because
    Python found ``problem.name`` outside the folder its distribution is installed
    in, or the error came from a file outside this environment. None if neither."""
    try:
        installed = Path(importlib.metadata.distribution(problem.name).locate_file(""))
    except importlib.metadata.PackageNotFoundError:
        installed = None
    files = []
    if problem.origin and installed and not _inside(problem.origin, installed):
        files.append(problem.origin)
    if problem.where and not any(
        _inside(problem.where, folder) for folder in _environment_folders()
    ):
        files.append(problem.where)
    for file in files:
        if not Path(file).is_file():  # "<frozen importlib._bootstrap>"
            continue
        entry = _search_entry(file)
        if entry is None:
            return file, problem.name, "on Python's search path"
        top = Path(file).resolve().relative_to(entry).parts[0]
        return str(entry / top), top.removesuffix(".py"), _how(entry)
    return None


def _how(entry: Path) -> str:
    """How the search-path entry ``entry`` came to be there."""
    if entry == Path.cwd().resolve():
        return "in the working folder"
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if any(path and Path(path).resolve() == entry for path in paths):
        return "on PYTHONPATH"
    return "on Python's search path"


def broken_distributions(problems: Sequence[ImportProblem]) -> list[str]:
    """The distributions to reinstall: those owning the files that raised (numpy
    when torch fails inside numpy), else the packages that failed."""
    owners = importlib.metadata.packages_distributions()
    site = [Path(sysconfig.get_paths()[n]).resolve() for n in ("purelib", "platlib")]
    found: list[str] = []
    for problem in problems:
        name = problem.name
        for folder in site:
            if problem.where and _inside(problem.where, folder):
                top = Path(problem.where).resolve().relative_to(folder).parts[0]
                name = owners.get(top.removesuffix(".py"), [name])[0]
                break
        if name not in found:
            found.append(name)
    return found
