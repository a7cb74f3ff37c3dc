"""The lessons' GPU-only cells, run without Jupyter (``make gpu-check``).

A GPU cell is a code cell tagged ``nbval-skip`` (CI has no GPU); the GPUs it needs
come from its first test, ``if cuda_device_count() < N:`` (N) or
``torch.cuda.is_available()`` (1). ``python -m multigpu.doctor.notebook_cells
NOTEBOOK`` runs the notebook's code cells in order in this one plain Python process
(no Jupyter, so it also runs where only torch is installed), up to its last GPU
cell, in the notebook's folder; it drops IPython's line magics (``%xmode``), lets a
cell tagged ``raises-exception`` raise, and prints one JSON line with what each GPU
cell printed. Outputs are not compared with the stored ones: on GPUs they
legitimately differ (timings, devices). The stored notebook is not changed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import traceback
from pathlib import Path

SKIP_TAG = "nbval-skip"
RAISES_TAG = "raises-exception"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def gpus_needed(source: str) -> int:
    """How many GPUs a GPU cell's first test asks for (1 where it names none)."""
    match = re.search(r"cuda_device_count\(\)\s*<\s*(\d+)", source)
    return int(match.group(1)) if match else 1


def gpu_cells(path: Path) -> list[tuple[int, int]]:
    """``[(cell index, GPUs needed), ...]``: the GPU-only code cells of ``path``."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    return [
        (index, gpus_needed(_source(cell)))
        for index, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        and SKIP_TAG in cell.get("metadata", {}).get("tags", [])
    ]


def python_code(source: str) -> str:
    """``source`` without IPython's line magics (``%xmode Minimal``), which plain
    Python cannot run; a cell magic (``%%writefile``) is refused by name."""
    if source.lstrip().startswith("%%"):
        raise ValueError(f"a cell magic ({source.split()[0]}) needs IPython")
    return "\n".join(
        "pass  # " + line if line.lstrip().startswith(("%", "!")) else line
        for line in source.splitlines()
    )


def run_notebook(path: Path) -> dict:
    """Run ``path``'s code cells up to its last GPU cell in this process; return
    ``{"cells": [{"index", "gpus", "output", "error"}, ...], "error": ...}``."""
    path = Path(path).resolve()
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    wanted = dict(gpu_cells(path))
    if not wanted:
        return {"cells": [], "error": None}
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    namespace: dict = {"__name__": "__main__"}
    reports = []
    for index, cell in enumerate(cells[: max(wanted) + 1]):
        if cell["cell_type"] != "code":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        captured = io.StringIO()
        error = None
        try:
            code = compile(python_code(_source(cell)), f"<cell {index}>", "exec")
            with contextlib.redirect_stdout(captured):
                exec(code, namespace)
        except Exception as exc:  # a lesson cell's own error
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if RAISES_TAG in tags and index not in wanted:
                error = None  # the lesson shows this error on purpose
            elif index not in wanted:
                tail = traceback.format_exc().strip().splitlines()[-1]
                return {"cells": reports, "error": f"cell {index}: {tail}"}
        if index in wanted:
            output = captured.getvalue().strip()
            reports.append(
                {
                    "index": index,
                    "gpus": wanted[index],
                    "output": output,
                    "error": error,
                }
            )
    return {"cells": reports, "error": None}


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    print(json.dumps(run_notebook(Path(sys.argv[1]))), flush=True)
