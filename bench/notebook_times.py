"""Time every notebook top to bottom against the 60 s budget of docs/notebooks.md.

    python bench/notebook_times.py            # every lesson, then every solution
    python bench/notebook_times.py notebooks/07_collectives_from_scratch.ipynb

``make bench`` runs the first. The notebooks are executed in memory, the files on
disk are not changed. Each one gets a fresh kernel, so the time includes kernel
start-up and imports, as a learner's "Restart and run all" would.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

BUDGET_SECONDS = 60.0
ROOT = Path(__file__).resolve().parents[1]


def notebooks(args: list[str]) -> list[Path]:
    if args:
        return [Path(a).resolve() for a in args]
    lessons = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    return lessons + sorted((ROOT / "notebooks" / "solutions").glob("[0-9]*.ipynb"))


def time_notebook(path: Path) -> float:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="notebooks to time (default: notebooks/[0-9]*.ipynb, then solutions/)",
    )
    args = parser.parse_args(argv).notebooks
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"budget {BUDGET_SECONDS:.0f} s per notebook"
    )
    print(f"{'notebook':70} {'seconds':>8}  within budget", flush=True)
    over = 0
    total = 0.0
    for path in notebooks(args):
        seconds = time_notebook(path)
        total += seconds
        ok = seconds <= BUDGET_SECONDS
        over += not ok
        print(
            f"{str(path.relative_to(ROOT)):70} {seconds:8.1f}  {'yes' if ok else 'NO'}",
            flush=True,
        )
    print(f"{'total':70} {total:8.1f}  {over} over budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
