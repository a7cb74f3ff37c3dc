"""Real launches, timed: gloo ranks through spawn, and a 2-rank torchrun job."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from multigpu.doctor.causes import AGAIN, launch_failure
from multigpu.doctor.environment import install_command
from multigpu.doctor.imports import not_importable
from multigpu.doctor.network import (
    LOCAL_ADDR,
    local_addr_fix,
    loopback_error,
    loopback_up_fix,
    torchrun_name_problem,
)
from multigpu.doctor.result import CheckResult, fail, ok

WORLD_SIZES = (2, 4)
SPAWN_TIMEOUT_S = 10.0  # each collective and the rendezvous
SPAWN_DEADLINE_S = 20.0  # a whole launch (the first also starts the forkserver)
TORCHRUN_DEADLINE_S = 25.0  # the whole 2-rank torchrun job
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


def _refused(
    check: str, connect: Callable[[], OSError | None], platform: str
) -> CheckResult | None:
    """A failure of ``check`` without a launch when 127.0.0.1 refuses connections:
    no rank could reach another (the launch would only time out)."""
    refused = connect()
    if refused is None:
        return None
    return fail(
        check,
        f"not started: nothing can connect to 127.0.0.1 ({refused}), where every "
        "rank connects",
        loopback_up_fix(refused, platform) + AGAIN,
    )


def _reinstall() -> str:
    return install_command().replace(" install ", " install --force-reinstall ")


def check_gloo(
    world_sizes: Sequence[int] = WORLD_SIZES,
    launch: Callable[[int], list[Any]] = spawn_gloo,
    platform: str = sys.platform,
    connect: Callable[[], OSError | None] = loopback_error,
    explain: Callable[..., tuple[str, str]] = launch_failure,
) -> CheckResult:
    """gloo starts 2 and 4 ranks, and their all-reduce gives the right sums. The
    launches start only where 127.0.0.1 connects (``connect``); a failure is
    explained (``explain``: a busy machine, ...) before a fix is chosen."""
    if launch is spawn_gloo and (broken := not_importable("gloo launch", "torch")):
        return broken
    if refused := _refused("gloo launch", connect, platform):
        return refused
    from multigpu.ranks.doctor import expected_all_reduce
    from multigpu.runtime.launch import DeadlineExceededError

    timings = []
    for world_size in world_sizes:
        start = time.monotonic()
        try:
            results = launch(world_size)
        except Exception as exc:
            # Started but not finished in time: past the deadline, or a rank that
            # gave up waiting for its peers.
            late = isinstance(exc, DeadlineExceededError) or getattr(
                exc, "timed_out", False
            )
            limit = getattr(exc, "deadline", SPAWN_TIMEOUT_S)
            measured, fix = explain(
                f"{world_size} ranks", _first_line(exc), limit if late else None
            )
            return fail("gloo launch", measured, fix)
        seconds = time.monotonic() - start
        expected = expected_all_reduce(world_size)
        wrong = [rank for rank, got in enumerate(results) if got != expected]
        if wrong or len(results) != world_size:
            return fail(
                "gloo launch",
                f"all-reduce over {world_size} ranks gave {results} instead of "
                f"{expected} on every rank",
                _reinstall(),
            )
        timings.append(f"{world_size} ranks in {seconds:.1f} s")
    return ok(
        "gloo launch",
        f"{', '.join(timings)} (the first starts the forkserver): all-reduce correct",
    )


def torchrun_job(env: Mapping[str, str] | None = None) -> str:
    """Run the 2-rank torchrun example (with the variables ``env`` added); return
    what it printed on stdout."""
    from multigpu.runtime.launch import run_torchrun

    return run_torchrun(
        TORCHRUN_MODULE, 2, deadline=TORCHRUN_DEADLINE_S, env=env
    ).stdout


def check_torchrun(
    run: Callable[..., str] = torchrun_job,
    platform: str = sys.platform,
    name_problem: Callable[[], str | None] = torchrun_name_problem,
    connect: Callable[[], OSError | None] = loopback_error,
    explain: Callable[..., tuple[str, str]] = launch_failure,
) -> CheckResult:
    """``torchrun --standalone --nproc-per-node=2`` runs a job to the end. It
    starts only where 127.0.0.1 connects (``connect``); where its ranks cannot meet
    at this machine's name (``name_problem``), the job runs with the fix,
    ``--local-addr=127.0.0.1``, instead: the check fails and says whether the fix
    works. A failure is explained (``explain``) before a fix is chosen."""
    if refused := _refused("torchrun", connect, platform):
        return refused
    meeting = name_problem()
    start = time.monotonic()
    try:
        output = run({LOCAL_ADDR: "127.0.0.1"}) if meeting else run()
    except Exception as exc:
        seconds = time.monotonic() - start
        if run is torchrun_job and (broken := not_importable("torchrun", "torch")):
            return broken
        head = _first_line(exc).removesuffix("; its output ends with:")
        errors = ERROR_LINE.findall(getattr(exc, "output", ""))
        said = f"; first error: {errors[0].strip()}" if errors else ""
        late = TORCHRUN_DEADLINE_S if seconds >= TORCHRUN_DEADLINE_S else None
        what = "2 ranks" + (" with --local-addr=127.0.0.1" if meeting else "")
        measured, fix = explain(what, head + said, late)
        if meeting:
            measured = f"its ranks meet at {meeting}; {measured}"
        return fail("torchrun", measured, fix)
    seconds = time.monotonic() - start
    if TORCHRUN_EXPECTED not in output:
        return fail(
            "torchrun",
            f"2 ranks ran but rank 0 printed {output.strip()!r}, "
            f"not {TORCHRUN_EXPECTED!r}",
            _reinstall(),
        )
    if meeting:
        return fail(
            "torchrun",
            f"--standalone cannot start here: its ranks meet at {meeting}; with "
            f"--local-addr=127.0.0.1 they did: {TORCHRUN_EXPECTED} in "
            f"{seconds:.1f} s",
            local_addr_fix(platform),
        )
    return ok(
        "torchrun",
        f"--standalone --nproc-per-node 2: {TORCHRUN_EXPECTED} in {seconds:.1f} s",
    )
