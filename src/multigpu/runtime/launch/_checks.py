"""Checks of the arguments of spawn and torchrun: clear errors before any process
starts."""

from __future__ import annotations

import math
import numbers
from typing import Any

from multigpu.core.checks import check_positive_int
from multigpu.runtime.launch import environment, timeouts


def check_seconds(name: str, value: Any, none_means: str) -> None:
    """``value`` must be a positive, finite number of seconds, or None."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds, or None for {none_means}; got "
            f"{value!r}."
        )
    if math.isinf(value) and value > 0:
        raise ValueError(
            f"{name}=inf cannot be used: torch.distributed and the launcher need a "
            f"finite number of seconds. For {none_means}, pass {name}=None."
        )
    if not value > 0:
        raise ValueError(
            f"{name} must be a positive number of seconds, got {value!r}. For "
            f"{none_means}, pass {name}=None."
        )


def check_collective_timeout(timeout: Any) -> None:
    """spawn's ``timeout``: None, or from timeouts.MIN_TIMEOUT_S to MAX_TIMEOUT_S
    seconds."""
    check_seconds("timeout", timeout, "no timeout")
    low, high = timeouts.MIN_TIMEOUT_S, timeouts.MAX_TIMEOUT_S
    if timeout is not None and not low <= timeout <= high:
        raise ValueError(
            f"timeout must be from {low:g} to {high:.0f} seconds "
            f"(a year), got {timeout!r}: it bounds the rendezvous and each "
            "collective, and the ranks need a second to connect. For no timeout, "
            "pass timeout=None."
        )


def check_arguments(world_size: int, threads: int, **seconds: float | None) -> None:
    """``world_size``, then each of ``seconds`` (``timeout=`` for spawn, ``deadline=``
    for run_torchrun), then ``threads``."""
    check_positive_int(
        "world_size", world_size, "Ask for as many processes as you want ranks."
    )
    for name, value in seconds.items():
        check_seconds(name, value, f"no {name}")
    fix = "Pass how many CPU threads each rank may use, e.g. threads=1."
    check_positive_int("threads", threads, fix)
    most = environment.MAX_THREADS
    if threads > most:
        raise ValueError(
            f"threads must be an integer from 1 to {most} (this machine's CPU cores, "
            f"and at least 8), got {threads!r}: each rank would start that many "
            f"threads. {fix}"
        )
