"""``make gpu-check`` / ``python -m multigpu.doctor --gpu``: the GPU path, proved.

On a machine with CUDA GPUs it runs, each in child processes and within
``BUDGET_S`` seconds in all: the GPU-marked tests (pytest ``-m gpu``), the lessons'
GPU-only cells (without Jupyter: :mod:`multigpu.doctor.notebook_cells`), nccl
all-reduce bandwidth, a DDP step on 1 and 2 GPUs, the peak memory per GPU under
``nn.DataParallel``, and ``torchrun -m multigpu.ddp`` on nccl with the GPUs'
utilisation sampled by ``nvidia-smi`` (:mod:`multigpu.doctor.gpu_items`). It prints
one report, each line ✓, ✗ or - (skipped, with why), to stdout and to a file
(``--report``, default ``build/gpu-check.txt``). Exit status 1 when a line failed.

Without a GPU it says so in one line, lists what it would run and exits 0; with an
NVIDIA driver but no GPU torch can use (a CPU-only build, a driver too old) it says
that in one line and exits 1. It needs torch and pytest only: ``PYTHONPATH=src
python3 -m multigpu.doctor --gpu`` runs it on a machine with no ``.venv``. Any torch
version is accepted; the report names the one it ran with (docs/gpu.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from multigpu.doctor.gpu_items import (
    FAIL,
    OK,
    SKIP,
    Item,
    child,
    failure_text,
    gpu_notebooks,
    gpu_tests,
    last_json,
    run_all_reduce,
    run_ddp_steps,
    run_dp_memory,
    run_gpt4d,
    run_notebooks,
    run_pytest,
    run_torchrun,
)
from multigpu.doctor.result import marks_for, printable
from multigpu.doctor.torch_build import nvidia_gpu_present

BUDGET_S = 280.0  # the whole check on a GPU machine: under 5 minutes
# (runner, share of the seconds left when it starts)
RUNNERS = (
    (run_pytest, 0.6),
    (run_notebooks, 0.35),
    (run_all_reduce, 0.25),
    (run_ddp_steps, 0.35),
    (run_dp_memory, 0.3),
    (run_gpt4d, 0.4),
    (run_torchrun, 0.9),
)
DEFAULT_REPORT = "build/gpu-check.txt"


def project_root() -> Path:
    """The repository (``src/multigpu/doctor/`` is three folders below it)."""
    return Path(__file__).resolve().parents[3]


def plan(root: Path) -> list[str]:
    """What the check runs on a machine with GPUs, one line each."""
    tests = gpu_tests(root)
    two = sum(need >= 2 for _, need in tests)
    files = len({file for file, _ in tests})
    lines = [
        f"{len(tests)} GPU-marked tests in {files} files (pytest -m gpu; {two} need "
        "2 GPUs)"
    ]
    for notebook, cells in gpu_notebooks(root):
        need = max(n for _, n in cells)
        indices = ", ".join(str(i) for i, _ in cells)
        plural = "GPU" if need == 1 else "GPUs"
        lines.append(
            f"{Path(notebook).stem}: GPU cells {indices} (needs {need} {plural})"
        )
    lines += [
        "nccl all-reduce bandwidth, 1-256 MiB (needs 2 GPUs)",
        "a DDP step of ConvNet on 1 GPU and on 2 GPUs",
        "peak memory per GPU under nn.DataParallel (needs 2 GPUs)",
        "torchrun -m multigpu.gpt4d (19) on nccl, checked against one process",
        "torchrun -m multigpu.ddp on nccl, GPU utilisation sampled by nvidia-smi",
    ]
    return lines


def probe_text(found: dict) -> str:
    """``torch 2.14.1 (CUDA 13.0), nccl 2.27.7, 2 GPUs: Tesla T4 (14.6 GiB,
    compute capability 7.5), ...``."""
    build = f"CUDA {found['cuda']}" if found["cuda"] else "CPU-only build"
    gpus = found["gpus"]
    names = ", ".join(
        f"{g['name']} ({g['memory_gib']} GiB, compute capability {g['capability']})"
        for g in gpus
    )
    nccl = f", nccl {found['nccl']}" if found.get("nccl") else ""
    count = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
    return f"torch {found['torch']} ({build}){nccl}, {count}: {names}"


def no_gpu_line(found: dict, driver: bool) -> tuple[str, int]:
    """The one line (and exit status) for a machine where torch sees no GPU."""
    torch = f"torch {found['torch']}"
    if not driver:
        build = f"CUDA {found['cuda']} build" if found["cuda"] else "CPU-only build"
        return f"gpu-check: no GPU on this machine ({torch}, {build}): nothing run", 0
    if not found["cuda"]:
        return (
            f"gpu-check: ✗ an NVIDIA driver is here but {torch} is a CPU-only build: "
            "reinstall with `rm -rf .venv && make lab TORCH=pypi`",
            1,
        )
    warning = found.get("warning") or "torch.cuda.is_available() is False"
    return (
        f"gpu-check: ✗ an NVIDIA driver is here but {torch} (CUDA {found['cuda']}) "
        f"cannot use it: {warning}. Update the driver (nvidia-smi names it) or "
        "install a torch built for an older CUDA",
        1,
    )


def has_kernels(capability: str, arch: list[str]) -> bool:
    """Whether a torch built for ``arch`` (``["sm_75", "sm_80", ...]``) runs on a GPU
    of ``capability`` ("8.6"): a cubin of the same major version and no newer minor,
    or PTX (``compute_XY``) no newer than the GPU."""
    major, minor = (int(part) for part in capability.split("."))
    for name in arch:
        kind, _, digits = name.partition("_")
        digits = digits.rstrip("abf")
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and built[0] == major and built[1] <= minor:
            return True
        if kind == "compute" and built <= (major, minor):
            return True
    return False


def kernels_item(found: dict) -> Item:
    """Whether this torch has kernels for every GPU's compute capability
    (``sm_75`` for a T4; CUDA 13 builds have none for 7.0 and older)."""
    arch = list(found.get("arch") or [])
    missing = sorted(
        {
            g["capability"]
            for g in found["gpus"]
            if not has_kernels(g["capability"], arch)
        }
    )
    shown = ", ".join(arch) or "none listed"
    if missing:
        return Item(
            "torch kernels",
            FAIL,
            f"torch {found['torch']} has no kernels for compute capability "
            f"{', '.join(missing)} (built for {shown}): use a GPU it lists, or a "
            "torch built for this one",
        )
    return Item("torch kernels", OK, f"built for {shown}")


def run_items(
    gpus: int, root: Path, budget: float, shown: Callable[[Item], None] = print
) -> list[Item]:
    """Every runner in order, each given its share of the time left; each line is
    handed to ``shown`` as soon as its runner ends."""
    items, deadline = [], time.monotonic() + budget
    for runner, share in RUNNERS:
        name = runner.__name__.removeprefix("run_")
        left = deadline - time.monotonic()
        if left < 5:
            found = [Item(name, FAIL, "not run: the check's time ran out")]
        else:
            try:
                found = runner(gpus, left * share, root)
            except Exception as error:  # one item's own bug must not hide the others
                found = [Item(name, FAIL, f"{type(error).__name__}: {error}")]
        for item in found:
            shown(item)
        items += found
    return items


def format_item(item: Item, marks: dict[str, str]) -> str:
    """``✓ name  text`` (``-`` for a skipped item)."""
    mark = {OK: marks["ok"], FAIL: marks["fail"], SKIP: "-"}[item.status]
    return f"{mark:2} {item.name:<24} {item.text}"


def main(report: str | None = None, out: TextIO | None = None) -> int:
    """Run the check, print the report and write it to ``report``; the exit status
    (0: no GPU, or every item passed or was skipped)."""
    out = sys.stdout if out is None else out
    marks = marks_for(getattr(out, "encoding", None))
    root, start = project_root(), time.monotonic()
    path = Path(report or root / DEFAULT_REPORT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")

    def say(line: str) -> None:  # to the stream and the report, line by line
        print(printable(line, marks), file=out, flush=True)
        with path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")

    status, stdout, stderr = child(
        ["-m", "multigpu.doctor.gpu_measure", "probe"], 120, root
    )
    found = last_json(stdout) if status == 0 else None
    if found is None:
        say(f"gpu-check: ✗ torch does not import here ({failure_text(status, stderr)})")
        code = 1
    elif not found["gpus"]:
        line, code = no_gpu_line(found, nvidia_gpu_present())
        say(line)
        say("With GPUs it runs:")
        for planned in plan(root):
            say(f"  - {planned}")
    else:
        say(f"gpu-check: {probe_text(found)}")
        first = kernels_item(found)
        say(format_item(first, marks))
        budget = BUDGET_S - (time.monotonic() - start)
        items = [first] + run_items(
            len(found["gpus"]), root, budget, lambda item: say(format_item(item, marks))
        )
        counts = {s: sum(i.status == s for i in items) for s in (OK, FAIL, SKIP)}
        say(
            f"gpu-check: {counts[OK]} ✓ {counts[FAIL]} ✗ {counts[SKIP]} skipped in "
            f"{time.monotonic() - start:.0f} s with torch {found['torch']}"
        )
        code = 1 if counts[FAIL] else 0
    print(f"report written to {path}", file=out, flush=True)
    return code
