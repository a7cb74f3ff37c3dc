"""Run the checks in order, print each line as it is found, then the summary."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from multigpu.doctor.environment import (
    check_kernel,
    check_packages,
    check_python,
    installed_version,
)
from multigpu.doctor.gpus import check_gpus
from multigpu.doctor.imports import import_error
from multigpu.doctor.lab_folders import check_lab_folders
from multigpu.doctor.launches import check_gloo, check_torchrun
from multigpu.doctor.machine import check_cores, check_disk, check_memory, usable_cores
from multigpu.doctor.network import check_host_name, check_libuv, check_ports
from multigpu.doctor.result import (
    ASCII_MARKS,
    FAIL,
    CheckResult,
    fail,
    format_result,
    marks_for,
    summary_line,
)
from multigpu.doctor.torch_build import check_torch_build

Check = Callable[[], "CheckResult | None"]
QUICK_CHECKS: tuple[Check, ...] = (
    check_python,
    check_packages,
    check_kernel,
    check_lab_folders,
    check_disk,
    check_memory,
    check_cores,
    check_host_name,
    check_ports,
    check_libuv,
    check_torch_build,
    check_gpus,
)
# torchrun starts first, in a thread, and runs while the checks above and gloo's
# launches do (its ranks wait for each other more than they compute).
LAUNCH_CHECKS: tuple[Check, ...] = (check_gloo,)
BACKGROUND_CHECKS: tuple[Check, ...] = (check_torchrun,)


def run_check(check: Check) -> CheckResult | None:
    """``check()``, or a failure that names the check if it raised itself."""
    try:
        return check()
    except Exception as exc:
        name = check.__name__.removeprefix("check_")
        return fail(
            name,
            f"the check itself raised {type(exc).__name__}: {exc}",
            "paste this output to your instructor",
        )


def machine_facts() -> list[str]:
    """``Linux x86_64``, ``Python 3.11.7``, ``torch 2.14.1``, ``2 cores``,
    ``no GPU``: what the summary says about the machine (``torch 2.14.1 (does not
    import)`` and ``GPUs unknown`` where torch does not import)."""
    cores = usable_cores()
    facts = [
        f"{platform.system()} {platform.machine()}",
        f"Python {platform.python_version()}",
        f"torch {installed_version('torch') or 'missing'}",
        f"{cores} core{'s' if cores != 1 else ''}",
    ]
    try:
        if import_error("torch") is not None:
            raise ImportError("torch does not import")
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        facts[2] += " (does not import)" if installed_version("torch") else ""
        return [*facts, "GPUs unknown"]
    return [*facts, f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "no GPU"]


@contextlib.contextmanager
def stderr_to_log() -> Iterator[Path | None]:
    """Send what is written to file descriptor 2 (the ranks' own messages, c10d's
    warnings) to a new temporary file while the checks run; yield its path (None
    where none can be made: stderr is then left alone)."""
    try:
        handle, name = tempfile.mkstemp(prefix="multigpu-doctor-", suffix=".log")
    except OSError:
        yield None
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(handle, 2)
    os.close(handle)
    try:
        yield Path(name)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def log_lines(log: Path | None) -> int:
    """How many lines were written to ``log``; an empty log is removed."""
    if log is None:
        return 0
    try:
        count = len(log.read_bytes().splitlines())
        if count == 0:
            log.unlink()
        return count
    except OSError:
        return 0


def run_checks(checks: Sequence[Check], out: TextIO | None = None) -> list[CheckResult]:
    """Run ``checks`` in order; print each result to ``out`` as it comes."""
    marks = marks_for(getattr(out, "encoding", None))
    results = []
    for check in checks:
        result = run_check(check)
        if result is None:  # a check that does not apply here (USE_LIBUV)
            continue
        results.append(result)
        if out is not None:
            print(format_result(result, marks), file=out, flush=True)
    return results


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``python -m multigpu.doctor [--quick] [--json]``: 1 if a needed check
    failed, else 0 (warnings do not fail); ``--gpu [--report PATH]``: the GPU
    check of :mod:`multigpu.doctor.gpu_check` instead."""
    parser = argparse.ArgumentParser(
        prog="python -m multigpu.doctor",
        description="Check this machine for the multigpu workshop.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="skip the launches (gloo, torchrun)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU path instead (make gpu-check): GPU tests, GPU cells, nccl",
    )
    parser.add_argument(
        "--report", metavar="PATH", help="--gpu: where the report goes too"
    )
    options = parser.parse_args(argv)
    if options.gpu:
        from multigpu.doctor.gpu_check import main as gpu_check

        return gpu_check(options.report, out)
    out = sys.stdout if out is None else out
    start = time.monotonic()
    with stderr_to_log() as log, ThreadPoolExecutor(max_workers=1) as pool:
        checks = QUICK_CHECKS
        if not options.quick:
            started = [pool.submit(run_check, c).result for c in BACKGROUND_CHECKS]
            checks = QUICK_CHECKS + LAUNCH_CHECKS + tuple(started)
        results = run_checks(checks, None if options.json else out)
        facts = machine_facts()
    marks = marks_for(getattr(out, "encoding", None))
    summary = summary_line(results, facts, marks)
    seconds = time.monotonic() - start
    lines = log_lines(log)
    if options.json:
        record = {
            "results": [result.as_dict() for result in results],
            "summary": summary,
            "seconds": round(seconds, 1),
            "log": str(log) if lines else None,
        }
        escaped = marks is ASCII_MARKS  # a stream that cannot write ✓ gets \u2713
        print(json.dumps(record, indent=1, ensure_ascii=escaped), file=out)
    else:
        if lines:
            print(f"\nthe checks' and ranks' own messages: {log}", file=out)
        skipped = " (--quick: launches skipped)" if options.quick else ""
        print(f"\nchecked in {seconds:.1f} s{skipped}; paste this line:", file=out)
        print(summary, file=out, flush=True)
    return 1 if any(result.status == FAIL for result in results) else 0
