"""The Python environment: the interpreter, the pinned packages, the Jupyter kernel."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from multigpu.doctor.imports import (
    NEEDED,
    NEEDED_FOR_LAB,
    ImportProblem,
    broken_distributions,
    import_problems,
    shadow,
)
from multigpu.doctor.result import CheckResult, fail, ok, warn

MINIMUM_PYTHON = (3, 11, 5)  # the pins in constraints.txt need it (README)
# NEEDED (the packages the notebooks import) and NEEDED_FOR_LAB (what JupyterLab
# needs to run them), from imports: missing, not importing, or torch/torchvision at
# another major.minor, fails; another patch version warns.
# Used by `make test` and by the doctor itself: missing or another version warns.
USEFUL = ("nbval", "nbconvert", "psutil")
SAME_MINOR = ("torch", "torchvision")
# A kernel whose argv[0] is one of these is started with the Jupyter server's own
# Python (jupyter_client's KernelManager.format_kernel_cmd).
SERVER_PYTHON = {
    "python",
    f"python{sys.version_info[0]}",
    "python{}.{}".format(*sys.version_info[:2]),
}


def project_root() -> Path:
    """The repository this package was installed from (``pip install -e``)."""
    return Path(__file__).resolve().parents[3]


def shown_python(executable: str = sys.executable) -> str:
    """``executable`` relative to the working directory where it lies below it
    (``.venv/bin/python``), else as it is."""
    try:
        return str(Path(executable).relative_to(Path.cwd()))
    except ValueError:
        return executable


def install_command() -> str:
    """The command that installs the pinned versions into this environment."""
    return f"{shown_python()} -m pip install -c constraints.txt -e '.[dev]'"


def check_python(version: Sequence[int] = sys.version_info[:3]) -> CheckResult:
    """Python is 3.11.5 or newer."""
    text = ".".join(map(str, version))
    if tuple(version) >= MINIMUM_PYTHON:
        return ok("Python", f"{text} ({shown_python()})")
    needed = ".".join(map(str, MINIMUM_PYTHON))
    return fail(
        "Python",
        f"{text} is older than {needed}, which the pinned packages need",
        f"install Python {needed} or newer, then `rm -rf .venv && make lab "
        "PYTHON=python3.12` (the Python you installed)",
    )


def read_pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of constraints.txt
    (names lower-cased, ``-`` as ``_``)."""
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.strip().lower().replace("-", "_")] = version.strip()
    return pins


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None if it is missing."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _public(version: str) -> str:
    return version.split("+")[0]  # 2.14.1+cpu is 2.14.1 (CPU-only build)


def check_packages(
    pins: Mapping[str, str] | None = None,
    version: Callable[[str], str | None] = installed_version,
    imports: Callable[[], Mapping[str, ImportProblem]] = import_problems,
) -> CheckResult:
    """The packages that matter are installed at the versions of constraints.txt
    (``pins``; default: the repository's file), and each of them imports (in a
    child process: ``imports``, see :mod:`multigpu.doctor.imports`)."""
    broken = [p for p in imports().values() if version(p.name) is not None]
    if broken:
        return _import_failure(broken)
    if pins is None:
        path = project_root() / "constraints.txt"
        if not path.is_file():
            return warn(
                "packages",
                f"no constraints.txt at {path.parent}: versions not compared",
                "run the doctor from the repository's environment (`make doctor`)",
            )
        pins = read_pins(path)
    failed, warned, seen = [], [], []
    for name in (*NEEDED, *NEEDED_FOR_LAB, *USEFUL):
        have, pinned = version(name), pins.get(name)
        if have is None:
            (warned if name in USEFUL else failed).append(f"{name} missing")
            continue
        seen.append(f"{name} {have}")
        if pinned is None or _public(have) == pinned:
            continue
        mismatch = f"{name} {have} (pinned {pinned})"
        same_minor = have.split(".")[:2] == pinned.split(".")[:2]
        (warned if same_minor or name not in SAME_MINOR else failed).append(mismatch)
    if failed:
        return fail("packages", "; ".join(failed + warned), install_command())
    if warned:
        return warn(
            "packages", "; ".join(warned) + ": others as pinned", install_command()
        )
    return ok(
        "packages",
        f"{', '.join(seen[:2])} and {len(seen) - 2} more, as in constraints.txt",
    )


def _import_failure(broken: list[ImportProblem]) -> CheckResult:
    """``packages`` failing: which packages do not import, grouped by error, and
    the fix for the first cause: a file that hides a package, else a reinstall."""
    by_error: dict[str, list[str]] = {}
    for problem in broken:
        by_error.setdefault(problem.error, []).append(problem.name)
    measured = "; ".join(
        f"{_names(names)} {'does' if len(names) == 1 else 'do'} not import ({error})"
        for error, names in by_error.items()
    )
    for problem in broken:
        hiding = shadow(problem)
        if hiding is not None:
            path, package, how = hiding
            return fail(
                "packages",
                measured,
                f"rename or move away {path} ({how}): Python imports it instead "
                f"of the installed {package}",
            )
    return fail(
        "packages",
        measured,
        f"{shown_python()} -m pip install --force-reinstall --no-deps -c "
        f"constraints.txt {' '.join(broken_distributions(broken))}",
    )


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def python3_kernel() -> tuple[list[str], str]:
    """The argv and directory of the ``python3`` kernel JupyterLab would start."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return list(spec.argv), spec.resource_dir


def check_kernel(
    kernel: Callable[[], tuple[list[str], str]] = python3_kernel,
    executable: str = sys.executable,
) -> CheckResult:
    """The python3 kernel JupyterLab starts runs this environment's Python."""
    reinstall = f"{shown_python(executable)} -m ipykernel install --sys-prefix"
    try:
        argv, where = kernel()
    except Exception as exc:  # jupyter_client missing, NoSuchKernel, a bad JSON
        return fail("Jupyter kernel", f"no python3 kernel: {exc}", reinstall)
    first = argv[0] if argv else ""
    if first in SERVER_PYTHON:
        return ok(
            "Jupyter kernel",
            "notebooks will run on the Python that runs JupyterLab: this "
            f"course's, when `make lab` starts it (kernel python3 runs `{first}`)",
        )
    if _same_environment(first, executable):
        return ok(
            "Jupyter kernel",
            f"notebooks will run on this course's Python ({first})",
        )
    return fail(
        "Jupyter kernel",
        f"python3 ({where}) runs {first}, not this environment's "
        f"{shown_python(executable)}",
        reinstall,
    )


def _same_environment(program: str, executable: str) -> bool:
    """Whether ``program`` is ``executable`` or lies in the same environment's
    bin directory (a venv's pythons are links to one interpreter: compare folders,
    not the files they point to)."""
    if not os.path.isabs(program):
        return False
    here, there = Path(executable).absolute(), Path(program).absolute()
    return here == there or here.parent.resolve() == there.parent.resolve()
