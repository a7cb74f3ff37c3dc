"""What ``make gpu-check`` runs, item by item, each in child processes.

Every runner takes the GPU count and the seconds left, and returns report lines
(:class:`Item`): ``ok``, ``fail`` or ``skip`` (with the reason, e.g. "needs 2 GPUs,
this machine has 1"). The parent never imports torch: the ranks and the
measurements start from a process that has not touched CUDA (docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from multigpu.doctor.notebook_cells import gpu_cells

OK, FAIL, SKIP = "ok", "fail", "skip"
GPU_MARK = re.compile(r"@pytest\.mark\.gpu(?:\((\d*)\))?")


@dataclass(frozen=True)
class Item:
    """One line of the report: ``name``, ``status`` (ok, fail, skip), ``text``."""

    name: str
    status: str
    text: str


def skipped(name: str, needed: int, gpus: int) -> Item:
    """The line for an item that needs more GPUs than this machine has."""
    plural = "GPU" if needed == 1 else "GPUs"
    return Item(
        name, SKIP, f"skipped: needs {needed} {plural}, this machine has {gpus}"
    )


def child(
    arguments: list[str], seconds: float, root: Path, env: dict | None = None
) -> tuple[int, str, str]:
    """Run ``python ARGUMENTS`` in ``root`` within ``seconds``: (status, stdout,
    stderr); status 124 and a note on stderr where it ran out of time."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    try:
        done = subprocess.run(
            [sys.executable, *arguments],
            cwd=root,
            env=environment,
            capture_output=True,
            text=True,
            timeout=max(seconds, 1),
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return 124, out, f"stopped after {seconds:.0f} s"
    return done.returncode, done.stdout, done.stderr


def last_json(stdout: str) -> dict | None:
    """The last line of ``stdout`` that is a JSON object, or None."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def failure_text(status: int, stderr: str) -> str:
    """A child's error in one line, with its exit status: the first line a script
    of the course wrote for it (``...: error: ...``, ``rank R: ...``), else the
    last line that is not a rule of ``=`` or ``-``."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip("=- \n")]
    own = [
        line for line in lines if ": error: " in line or re.match(r"rank \d+: ", line)
    ]
    chosen = own[0] if own else lines[-1] if lines else "no error output"
    return f"exit status {status}: {chosen}"


def gpu_tests(root: Path) -> list[tuple[str, int]]:
    """``[(test file, GPUs needed), ...]``, one per GPU-marked test function."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        for match in GPU_MARK.finditer(path.read_text(encoding="utf-8")):
            found.append((path.relative_to(root).as_posix(), int(match[1] or 1)))
    return found


def gpu_notebooks(root: Path) -> list[tuple[str, list[tuple[int, int]]]]:
    """``[(notebook, [(cell, GPUs needed), ...]), ...]`` for the lessons with GPU
    cells."""
    found = []
    for path in sorted((root / "notebooks").glob("[0-9]*.ipynb")):
        cells = gpu_cells(path)
        if cells:
            found.append((path.relative_to(root).as_posix(), cells))
    return found


def run_pytest(gpus: int, seconds: float, root: Path) -> list[Item]:
    """The GPU-marked tests, each a line (those needing more GPUs: skipped)."""
    files = sorted({file for file, _ in gpu_tests(root)})
    with tempfile.TemporaryDirectory() as folder:
        xml = Path(folder) / "gpu-tests.xml"
        arguments = ["-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider"]
        arguments += ["-m", "gpu", "-q", f"--junitxml={xml}", *files]
        import importlib.util

        if importlib.util.find_spec("pytest_timeout") is not None:
            arguments.append("--timeout=120")
        status, out, err = child(arguments, seconds, root)
        if not xml.exists():
            return [Item("GPU tests", FAIL, failure_text(status, err or out))]
        return test_items(xml.read_text(encoding="utf-8"), gpus)


def test_items(junit_xml: str, gpus: int) -> list[Item]:
    """One line per test case of pytest's ``--junitxml`` report."""
    items = []
    for case in ElementTree.fromstring(junit_xml).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        seconds = float(case.get("time") or 0)
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        skip = case.find("skipped")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()
            items.append(Item(name, FAIL, message[0] if message else "failed"))
        elif skip is not None:
            reason = skip.get("message") or ""
            needed = re.search(r"needs (\d+) CUDA GPU", reason)
            if needed:
                items.append(skipped(name, int(needed[1]), gpus))
            else:
                items.append(Item(name, SKIP, f"skipped: {reason}"))
        else:
            items.append(Item(name, OK, f"passed in {seconds:.1f} s"))
    return items or [Item("GPU tests", FAIL, "pytest ran no test")]


def run_notebooks(gpus: int, seconds: float, root: Path) -> list[Item]:
    """Each lesson with GPU cells, run without Jupyter up to its last GPU cell,
    when this machine has the GPUs its cells need; what those cells printed."""
    items, deadline = [], time.monotonic() + seconds
    for notebook, cells in gpu_notebooks(root):
        name = f"{Path(notebook).stem[:2]} cells {', '.join(str(i) for i, _ in cells)}"
        needed = max(need for _, need in cells)
        if gpus < needed:
            items.append(skipped(name, needed, gpus))
            continue
        left = deadline - time.monotonic()
        arguments = ["-m", "multigpu.doctor.notebook_cells", notebook]
        status, out, err = child(arguments, left, root, {"MPLBACKEND": "Agg"})
        found = last_json(out)
        if found is None or found["error"]:
            why = found["error"] if found else failure_text(status, err)
            items.append(Item(name, FAIL, why))
            continue
        for cell in found["cells"]:
            printed = " | ".join(cell["output"].splitlines()) or "(printed nothing)"
            status_ = FAIL if cell["error"] else OK
            text = f"raised {cell['error']}" if cell["error"] else f"printed: {printed}"
            items.append(Item(f"{name[:2]} cell {cell['index']}", status_, text))
    return items


def run_measure(name: str, item: list[str], seconds: float, root: Path):
    """``python -m multigpu.doctor.gpu_measure ITEM``: its JSON, or a FAIL line."""
    arguments = ["-m", "multigpu.doctor.gpu_measure", *item]
    status, out, err = child(arguments, seconds, root)
    found = last_json(out) if status == 0 else None
    return found if found is not None else Item(name, FAIL, failure_text(status, err))


def run_all_reduce(gpus: int, seconds: float, root: Path) -> list[Item]:
    """nccl all-reduce bus bandwidth on 2 GPUs (notebook 12's busbw)."""
    name = "nccl all-reduce"
    if gpus < 2:
        return [skipped(name, 2, gpus)]
    found = run_measure(name, ["allreduce"], seconds, root)
    if isinstance(found, Item):
        return [found]
    rows = "; ".join(
        f"{row['mib']} MiB {row['ms']:.2f} ms, busbw {row['busbw']:.1f} GB/s"
        for row in found["rows"]
    )
    return [Item(name, OK, f"2 ranks ({found['backend']}): {rows}")]


def run_ddp_steps(gpus: int, seconds: float, root: Path) -> list[Item]:
    """A DDP step of ConvNet on 1 GPU and on 2 GPUs (nccl), in ms."""
    items = []
    for world_size in (1, 2):
        name = f"DDP step, {world_size} GPU{'s' if world_size > 1 else ''}"
        if gpus < world_size:
            items.append(skipped(name, world_size, gpus))
            continue
        found = run_measure(name, ["ddp-step", str(world_size)], seconds / 2, root)
        if isinstance(found, Item):
            items.append(found)
            continue
        text = (
            f"{found['ms']:.2f} ms per step ({found['backend']}), batch "
            f"{found['batch_per_gpu']} per GPU"
        )
        items.append(Item(name, OK, text))
    return items


def run_dp_memory(gpus: int, seconds: float, root: Path) -> list[Item]:
    """Peak memory per GPU under nn.DataParallel, next to one GPU alone (03)."""
    name = "DataParallel memory"
    if gpus < 2:
        return [skipped(name, 2, gpus)]
    found = run_measure(name, ["dp-memory"], seconds, root)
    if isinstance(found, Item):
        return [found]
    per_gpu = ", ".join(
        f"cuda:{i} {mib:.0f} MiB" for i, mib in enumerate(found["per_gpu_mib"])
    )
    text = (
        f"batch {found['batch']}: peak {per_gpu}; one GPU alone "
        f"{found['one_gpu_mib']:.0f} MiB"
    )
    return [Item(name, OK, text)]


def sample_utilisation(stop: threading.Event, rows: list[list[float]]) -> str | None:
    """Append ``[gpu, utilisation %, memory MiB]`` rows from ``nvidia-smi`` every
    0.2 s until ``stop``; None, or why nothing could be sampled."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi not found"
    query = "--query-gpu=index,utilization.gpu,memory.used"
    while not stop.is_set():
        done = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in done.stdout.splitlines():
            try:
                rows.append([float(value) for value in line.split(",")])
            except ValueError:
                continue
        stop.wait(0.2)
    return None


def torchrun_within(
    module: str, ranks: int, arguments: list[str], seconds: float
) -> tuple[int, str, str]:
    """``torchrun -m module arguments`` on ``ranks`` processes, ended with every
    rank at the deadline: (status, stdout, stderr); status 124 and one line when
    it ran out of time or could not start."""
    from multigpu.runtime.launch import TorchrunError, run_torchrun

    try:
        done = run_torchrun(
            module, ranks, *arguments, deadline=max(seconds, 5), check=False
        )
    except TorchrunError as error:
        return 124, "", str(error).splitlines()[0]
    return done.returncode, done.stdout, done.stderr


def run_torchrun(gpus: int, seconds: float, root: Path) -> list[Item]:
    """``torchrun -m multigpu.ddp`` on nccl (one rank per GPU, at most 2), with
    the GPUs' utilisation sampled while it trains (the number to watch in
    ``nvidia-smi``)."""
    ranks = min(gpus, 2)
    name = f"torchrun nccl, {ranks} rank{'s' if ranks > 1 else ''}"
    arguments = ["--epochs", "3", "--backend", "nccl", "--no-progress"]
    rows: list[list[float]] = []
    stop, why = threading.Event(), []
    sampler = threading.Thread(
        target=lambda: why.append(sample_utilisation(stop, rows)), daemon=True
    )
    sampler.start()
    start = time.monotonic()
    try:
        status, out, err = torchrun_within("multigpu.ddp", ranks, arguments, seconds)
    finally:
        took = time.monotonic() - start
        stop.set()
        sampler.join(5)
    if status != 0 or "same weights: True" not in out:
        return [Item(name, FAIL, failure_text(status, f"{err}\n{out}"))]
    epochs = [line for line in out.splitlines() if line.startswith("epoch")]
    text = f"3 epochs in {took:.1f} s, {epochs[-1] if epochs else 'no epoch line'}"
    return [Item(name, OK, text), utilisation_item(rows, why[0] if why else None)]


def run_gpt4d(gpus: int, seconds: float, root: Path) -> list[Item]:
    """``torchrun -m multigpu.gpt4d`` (19's 4-D script) on nccl: one rank per GPU,
    a pipeline of 2 stages on 2 GPUs; it checks itself against one process."""
    ranks = min(gpus, 2)
    name = f"4-D GPT on nccl, {ranks} rank{'s' if ranks > 1 else ''}"
    grid = ["--pp", "2"] if ranks == 2 else []
    arguments = [*grid, "--steps", "2", "--backend", "nccl"]
    status, out, err = torchrun_within("multigpu.gpt4d", ranks, arguments, seconds)
    verdict = [line for line in out.splitlines() if "equal to one process" in line]
    if status != 0 or not verdict or not verdict[-1].endswith("True"):
        return [Item(name, FAIL, failure_text(status, f"{err}\n{out}"))]
    first = out.splitlines()[0] if out else ""
    return [Item(name, OK, f"{first}; {verdict[-1]}")]


def utilisation_item(rows: list[list[float]], why: str | None) -> Item:
    """The utilisation line: per GPU, its highest and mean ``utilization.gpu``."""
    name = "GPU utilisation"
    if why or not rows:
        return Item(name, SKIP, f"not sampled: {why or 'nvidia-smi printed nothing'}")
    parts = []
    for gpu in sorted({int(row[0]) for row in rows}):
        values = [row[1] for row in rows if int(row[0]) == gpu]
        memory = max(row[2] for row in rows if int(row[0]) == gpu)
        parts.append(
            f"GPU {gpu} max {max(values):.0f}%, mean {sum(values) / len(values):.0f}%"
            f", memory up to {memory:.0f} MiB"
        )
    samples = len(rows) // max(1, len({int(row[0]) for row in rows}))
    return Item(name, OK, f"{'; '.join(parts)} ({samples} samples, nvidia-smi)")
