"""The machine: free disk, free memory, CPU cores."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from multigpu.core.sizes import GiB
from multigpu.doctor.result import CheckResult, fail, ok, warn

# Disk: checkpoints, Jupyter's files and pip's cache need little; below DISK_NEEDED
# a notebook's checkpoint or a pip install fails.
DISK_NEEDED = 1 * GiB
DISK_COMFORTABLE = 5 * GiB
# Memory: the JupyterLab server and kernel, and up to 4 ranks of torchrun that each
# import torch (about 1.5 GiB together), or 4 forked ranks of spawn (less).
MEMORY_NEEDED = 2 * GiB
MEMORY_COMFORTABLE = 4 * GiB
RANKS = 4  # the most ranks most launches of notebooks 07-16 start


def _gib(size: float) -> str:
    return f"{size / GiB:.1f} GiB"


def free_disk(paths: tuple[str, ...] | None = None) -> tuple[str, int]:
    """The folder with the least free space among the repository and the temporary
    folder, and that space in bytes."""
    if paths is None:
        from multigpu.doctor.environment import project_root

        paths = (str(project_root()), tempfile.gettempdir())
    return min(((p, shutil.disk_usage(p).free) for p in paths), key=lambda x: x[1])


def check_disk(disk: Callable[[], tuple[str, int]] = free_disk) -> CheckResult:
    """Enough free disk for the checkpoints and files the notebooks write."""
    where, free = disk()
    measured = f"{_gib(free)} free in {where}"
    fix = f"free disk space in {where} (at least {_gib(DISK_COMFORTABLE)})"
    if free < DISK_NEEDED:
        return fail("disk", measured + f": below {_gib(DISK_NEEDED)}", fix)
    if free < DISK_COMFORTABLE:
        return warn("disk", measured, fix)
    return ok("disk", measured)


def memory() -> tuple[int, int] | None:
    """(available, total) memory in bytes: psutil, else /proc/meminfo, else None."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        info = psutil.virtual_memory()
        return int(info.available), int(info.total)
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines}
    if "MemAvailable" not in fields or "MemTotal" not in fields:
        return None
    return fields["MemAvailable"], fields["MemTotal"]


def check_memory(
    measure: Callable[[], tuple[int, int] | None] = memory,
) -> CheckResult:
    """Enough memory available for JupyterLab and 4 ranks."""
    measured = measure()
    if measured is None:
        return warn(
            "memory",
            "cannot be measured here (no psutil, no /proc/meminfo)",
            "install psutil (`make setup`) and run the doctor again",
        )
    available, total = measured
    text = f"{_gib(available)} available of {_gib(total)}"
    fix = (
        f"close programs (browser tabs, IDEs) until {_gib(MEMORY_COMFORTABLE)} "
        "are available, then run the doctor again"
    )
    if available < MEMORY_NEEDED:
        return fail("memory", text + f": below {_gib(MEMORY_NEEDED)}", fix)
    if available < MEMORY_COMFORTABLE:
        return warn("memory", text, fix)
    return ok("memory", text)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform
    says, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_cores(cores: int | None = None) -> CheckResult:
    """What the cores mean for the 4-rank launches of notebooks 07-16."""
    cores = usable_cores() if cores is None else cores
    text = f"{cores} core{'s' if cores != 1 else ''}"
    if cores >= RANKS:
        return ok("cores", f"{text}: the {RANKS}-rank cells of 07-16 get a core each")
    return warn(
        "cores",
        f"{text}: the {RANKS}-rank cells of 07-16 run, slower "
        f"({RANKS} processes share {text})",
        "nothing to install: expect those cells to take longer, and close "
        "other busy programs during the workshop",
    )
