"""Checks of the arguments of spawn and torchrun: clear errors before any process
starts."""

from __future__ import annotations

import math
import numbers
from typing import Any

from multigpu.core.checks import check_positive_int


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


def check_arguments(world_size: int, timeout: float | None, threads: int) -> None:
    check_positive_int(
        "world_size", world_size, "Ask for as many processes as you want ranks."
    )
    check_seconds("timeout", timeout, "no timeout")
    check_positive_int(
        "threads",
        threads,
        "Pass how many CPU threads each rank may use, e.g. threads=1.",
    )
