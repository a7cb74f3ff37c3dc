"""Real launches, timed: gloo ranks through spawn, and a 2-rank torchrun job."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from multigpu.doctor.environment import install_command
from multigpu.doctor.network import loopback_fix
from multigpu.doctor.result import CheckResult, fail, ok

WORLD_SIZES = (2, 4)
SPAWN_TIMEOUT_S = 10.0  # each collective and the rendezvous
SPAWN_DEADLINE_S = 20.0  # a whole launch (the first also starts the forkserver)
TORCHRUN_TIMEOUT_S = 25.0
TORCHRUN_MODULE = "multigpu.ranks.torchrun_example"
TORCHRUN_EXPECTED = "world_size=2 sum=3"  # what its rank 0 prints
# A line of a Python error with a message (a rank's root cause comes first; torchrun's
# own ChildFailedError has an empty one).
ERROR_LINE = re.compile(r"^[\w.]*(?:Error|Exception): .*\S.*$", re.MULTILINE)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def spawn_gloo(world_size: int) -> list[Any]:
    """Each rank's all-reduce result from a gloo launch of ``world_size`` ranks."""
    from multigpu.ranks.doctor import all_reduce_check_rank
    from multigpu.runtime.launch import spawn

    return spawn(
        all_reduce_check_rank,
        world_size,
        backend="gloo",
        timeout=SPAWN_TIMEOUT_S,
        deadline=SPAWN_DEADLINE_S,
    )


def check_gloo(
    world_sizes: Sequence[int] = WORLD_SIZES,
    launch: Callable[[int], list[Any]] = spawn_gloo,
    platform: str = sys.platform,
) -> CheckResult:
    """gloo starts 2 and 4 ranks, and their all-reduce gives the right sums."""
    from multigpu.ranks.doctor import expected_all_reduce

    timings = []
    for world_size in world_sizes:
        start = time.monotonic()
        try:
            results = launch(world_size)
        except Exception as exc:
            return fail(
                "gloo launch",
                f"{world_size} ranks failed: {_first_line(exc)}",
                loopback_fix(platform) + ", then run the doctor again",
            )
        seconds = time.monotonic() - start
        expected = expected_all_reduce(world_size)
        wrong = [rank for rank, got in enumerate(results) if got != expected]
        if wrong or len(results) != world_size:
            return fail(
                "gloo launch",
                f"all-reduce over {world_size} ranks gave {results} instead of "
                f"{expected} on every rank",
                install_command().replace(" install ", " install --force-reinstall "),
            )
        timings.append(f"{world_size} ranks in {seconds:.1f} s")
    return ok(
        "gloo launch",
        f"{', '.join(timings)} (the first starts the forkserver): all-reduce correct",
    )


def torchrun_job() -> str:
    """Run the 2-rank torchrun example; return what it printed on stdout."""
    from multigpu.runtime.launch import run_torchrun

    return run_torchrun(TORCHRUN_MODULE, 2, timeout=TORCHRUN_TIMEOUT_S).stdout


def check_torchrun(
    run: Callable[[], str] = torchrun_job, platform: str = sys.platform
) -> CheckResult:
    """``torchrun --standalone --nproc-per-node=2`` runs a job to the end."""
    start = time.monotonic()
    fix = loopback_fix(platform) + ", then run the doctor again"
    try:
        output = run()
    except Exception as exc:
        head = _first_line(exc).removesuffix("; its output ends with:")
        errors = ERROR_LINE.findall(getattr(exc, "output", ""))
        said = f"; first error: {errors[0].strip()}" if errors else ""
        return fail("torchrun", f"2 ranks failed: {head}{said}", fix)
    seconds = time.monotonic() - start
    if TORCHRUN_EXPECTED not in output:
        return fail(
            "torchrun",
            f"2 ranks ran but rank 0 printed {output.strip()!r}, "
            f"not {TORCHRUN_EXPECTED!r}",
            fix,
        )
    return ok(
        "torchrun",
        f"--standalone --nproc-per-node 2: {TORCHRUN_EXPECTED} in {seconds:.1f} s",
    )
