"""When torch.distributed gave up waiting for its peers, the timedelta it gets for a
timeout in seconds, and the timeouts spawn accepts (07)."""

from __future__ import annotations

import traceback
from datetime import timedelta

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
