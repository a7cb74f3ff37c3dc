"""How long a rank takes to import its module, and whether it loads what it must not.

    python bench/import_times.py                  # every multigpu.ranks module, 3 runs
    python bench/import_times.py --repeats 5 multigpu.ranks.zero

A forkserver rank imports the module of its function before it runs, so every import
there delays every rank's start (docs/architecture.md, "Where new things go"). For
each module of ``multigpu.ranks`` (found with pkgutil), this runs
``python -X importtime -c "import MODULE"`` in a fresh process, REPEATS times, and
prints the median cumulative seconds of the top-level import (the last line of the
output, as ``| tail -1`` shows it: the module, with the packages above it and all it
imports), and which of matplotlib, torchvision and the DataParallel recorder
(``multigpu.dataparallel``) got imported. Exit 1 if a module imports one of them.
"""

from __future__ import annotations

import argparse
import pkgutil
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass

import multigpu.ranks

FORBIDDEN = ("matplotlib", "torchvision", "multigpu.dataparallel")
# "import time: self [us] | cumulative | imported package"; an import's imports (and
# the packages above it) follow the indented names, before its own line
LINE = re.compile(r"^import time:\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\S+)\s*$")


@dataclass
class ImportTime:
    """One ``python -X importtime -c "import MODULE"`` run."""

    seconds: float  # cumulative seconds of the top-level import (the last line)
    imported: set[str]  # every module the statement imported


def rank_modules() -> list[str]:
    """Every module and package directly in ``multigpu.ranks``."""
    prefix = f"{multigpu.ranks.__name__}."
    return sorted(
        info.name for info in pkgutil.iter_modules(multigpu.ranks.__path__, prefix)
    )


def parse_importtime(stderr: str, module: str) -> ImportTime:
    """Read ``-X importtime``'s report (stderr) of ``import module``."""
    rows = [match.groups() for match in map(LINE.match, stderr.splitlines()) if match]
    if not rows or rows[-1][2] != module:
        raise ValueError(f"no -X importtime line for {module} in:\n{stderr}")
    return ImportTime(int(rows[-1][1]) / 1e6, {name for *_, name in rows})


def forbidden_in(imported: set[str]) -> list[str]:
    """The FORBIDDEN packages among ``imported`` (a package or any of its modules)."""
    return [
        name
        for name in FORBIDDEN
        if any(m == name or m.startswith(f"{name}.") for m in imported)
    ]


def time_import(module: str) -> ImportTime:
    """One fresh interpreter importing ``module``."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        lines = result.stderr.splitlines()
        error = [line for line in lines if not line.startswith("import time:")]
        raise RuntimeError(f"import {module} failed: {error[-1] if error else '?'}")
    return parse_importtime(result.stderr, module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "modules", nargs="*", help="modules to time (default: every multigpu.ranks one)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per module (default: 3)"
    )
    options = parser.parse_args(argv)
    modules = options.modules or rank_modules()
    width = max(len(module) for module in modules)
    header = f"{'module':<{width}} {'import s':>9}  forbidden imported"
    print(f"median of {options.repeats} runs of python -X importtime")
    print(header)
    print("-" * len(header))
    failed = []
    for module in modules:
        try:
            runs = [time_import(module) for _ in range(options.repeats)]
        except (RuntimeError, ValueError) as error:
            print(f"{module:<{width}} {'-':>9}  ({error})", flush=True)
            failed.append(f"{module} could not be timed")
            continue
        found = sorted({name for run in runs for name in forbidden_in(run.imported)})
        failed += [f"{module} imports {name}" for name in found]
        seconds = statistics.median(run.seconds for run in runs)
        print(
            f"{module:<{width}} {seconds:>9.3f}  {', '.join(found) or 'none'}",
            flush=True,
        )
    for line in failed:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
