"""The two words for waiting, and their defaults, named once (07-16).

``timeout`` bounds the rendezvous and each collective: how long a rank waits for
its peers (spawn's ``timeout=``, the torchrun script's ``--timeout``). ``deadline``
bounds a whole run, from the call to the last rank's exit (spawn's, run_torchrun's,
run_with_restarts', run_nodes', the doctor's launches); a function whose limit bounds
the whole run refuses ``timeout=`` (:func:`deadline_not_timeout`). Launchers take
the defaults below instead of restating numbers. Also here: when torch.distributed
gave up waiting for its peers, the timedelta it gets for a timeout in seconds, and
the timeouts spawn accepts.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

# timeout=, in seconds: how long a rank waits in the rendezvous and in each collective.
DEFAULT_TIMEOUT_S = 30.0  # spawn's; every launcher that does not say otherwise
# Ranks with little to do between collectives (a checker's probe, the doctor): a
# rank stuck in a collective is named within seconds.
QUICK_TIMEOUT_S = 10.0
# Ranks that build and train FSDP2, ZeRO, pipeline or MiniDDP models (13-16, 10's
# checker): on a busy 2-core machine a peer may be that long between collectives.
SLOW_TIMEOUT_S = 60.0
# Twice that: more ranks than cores doing such work (14b's budget check, 4 ranks
# under FSDPMemTracker).
CROWDED_TIMEOUT_S = 2 * SLOW_TIMEOUT_S
# deadline=, in seconds: how long a whole run may take.
DEFAULT_DEADLINE_S = 300.0  # spawn's
TORCHRUN_DEADLINE_S = 120.0  # run_torchrun's: one torchrun job
# run_with_restarts' and run_nodes' (11): a job restarted after a fault, or one
# torchrun per node.
RESTARTS_DEADLINE_S = 240.0

# What torch gets for timeout=None: a year (torch needs a finite timedelta, and much
# longer ones overflow inside it).
NO_TIMEOUT = timedelta(days=365)
# The timeouts spawn accepts, in seconds: below a second the ranks cannot even
# connect (1e-3 failed inside torch); far above a year, the timedelta torch takes
# overflows (1e14, 1e300). For no timeout, timeout=None.
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = NO_TIMEOUT.total_seconds()


def is_communication_error(exc: BaseException) -> bool:
    """True for errors raised inside torch.distributed (often a peer's symptom),
    and for gloo's transport errors wherever they surface (``work.wait()`` raises
    "Connection closed by peer" from the caller's own line)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError) or "gloo/transport/" in str(exc):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "torch/distributed/" in frames[-1].filename.replace(
        "\\", "/"
    )


def is_timeout(exc: BaseException, waited_s: float, timeout: float | None) -> bool:
    """True when ``exc`` is torch.distributed giving up on its peers after
    ``timeout`` seconds, ``waited_s`` seconds after the rendezvous began.

    torch has no single exception type for this. A store wait (the rendezvous
    included) raises ``DistStoreError``; gloo, a plain ``RuntimeError`` "Timed out
    waiting ..."; nccl, when it raises rather than ending the process, a
    ``DistBackendError`` that mentions the timeout. So: nothing times out before
    ``timeout`` seconds have passed (nor ever, with ``timeout=None``); after that, a
    Python ``TimeoutError``, a store error, or an error from torch.distributed whose
    text says it timed out.
    """
    import torch.distributed as dist

    if timeout is None or waited_s < timeout:
        return False
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, dist.DistStoreError) and not isinstance(
        exc, dist.QueueEmptyError
    ):
        return True
    if not is_communication_error(exc):
        return False
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


def as_timedelta(timeout: float | None) -> timedelta:
    """The timedelta torch gets for ``timeout`` seconds (None: no timeout)."""
    return NO_TIMEOUT if timeout is None else timedelta(seconds=timeout)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def deadline_not_timeout(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Make ``function``, whose ``deadline=`` bounds the whole run, refuse
    ``timeout=`` with a ``TypeError`` that says to pass ``deadline=`` (07-11):
    ``timeout`` means each collective's bound everywhere else, so it must not
    quietly mean the whole run here."""

    @functools.wraps(function)
    def refusing(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if "timeout" in kwargs:
            value = kwargs["timeout"]
            raise TypeError(
                f"{function.__name__}() takes deadline=, not timeout=: deadline "
                "bounds the whole run, timeout each collective (as in spawn). Pass "
                f"deadline={value!r} instead of timeout={value!r}."
            )
        return function(*args, **kwargs)

    return refusing
