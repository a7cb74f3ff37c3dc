"""The ranks of notebook 11's hangs: a rank that comes late to a collective, and one
that skips it; each returns how the collective ended on it (11)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

SETUP_TIMEOUT_S = 60.0  # for making the groups of the hang demonstrations
SKIPPER_WAITS = 3  # how many times the others' timeout the skipping rank waits


def _outcome(rank: int, error: BaseException | None) -> dict[str, Any]:
    """A rank's result, in words that are the same on every run."""
    if error is None:
        return {"rank": rank, "result": "finished"}
    text = str(error)
    names = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    # DETAIL's message starts with this rank's own collective; what it says of the
    # peer's depends on how far the peer had got, so only this rank's is shown.
    own = re.search(rf"Rank {rank} is running collective: .*?OpType=([A-Z_]+)", text)
    if names:
        result = f"monitored_barrier: rank(s) {names.group(1)} did not arrive"
    elif "Detected mismatch between collectives" in text and own:
        result = f"collectives do not match (this rank was in {own.group(1)})"
    elif "Timed out" in text or "timed out" in text.lower():
        result = "timed out, waiting for a peer"
    elif "Connection closed by peer" in text or "Connection reset by peer" in text:
        result = "its peer was gone"
    else:
        result = f"failed: {type(error).__name__}"
    return {"rank": rank, "result": result}


def _short_group(timeout: float) -> Any:
    """A new gloo group of every rank whose collectives give up after ``timeout``
    seconds, so a hang is shown in seconds, not 30 minutes.

    The group is made, and its ranks connected, with a generous timeout (a busy
    machine can take seconds to connect them); ``dist.set_timeout`` then shortens
    it for what follows.
    """
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=SETUP_TIMEOUT_S))
    dist.barrier(group=group)  # every rank is here: the demonstration starts level
    dist.set_timeout(timedelta(seconds=timeout), group)
    return group


def late_rank(
    rank: int,
    world_size: int,
    late: int,
    delay: float,
    timeout: float,
    monitored: bool = False,
) -> dict[str, Any]:
    """Every rank joins one all-reduce; rank ``late`` first sleeps ``delay``
    seconds (a stuck data loader, a slow disk). With ``delay`` above ``timeout``
    the others give up. ``monitored``: first a ``dist.monitored_barrier``, on which
    rank 0 names the ranks that did not arrive. Returns how it went (11)."""
    group = _short_group(timeout)
    error, log = None, []
    with _stderr_into(log):  # gloo's C++ log: returned, not printed
        try:
            if rank == late:
                time.sleep(delay)
            if monitored:
                dist.monitored_barrier(
                    group, timeout=timedelta(seconds=timeout), wait_all_ranks=True
                )
            dist.all_reduce(torch.ones(4), group=group)
        except RuntimeError as caught:
            error = caught
    return {**_outcome(rank, error), "log": log}


def skipped_collective_rank(
    rank: int, world_size: int, skipping: int, timeout: float, detail: bool
) -> dict[str, Any]:
    """Rank ``skipping`` leaves out an all-reduce that the others make (a branch
    such as ``if loss.isfinite(): all_reduce(...)``) and goes on to the next
    collective, a barrier. ``detail``: the group is made at debug level DETAIL,
    what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` gives a torchrun script, so every
    collective is first checked against the other ranks' (11).

    Rank ``skipping`` gives up after ``SKIPPER_WAITS`` times ``timeout``, so that the
    ranks in the all-reduce time out first on any machine: a rank that gives up
    closes its connections, and a peer still waiting would then see "Connection
    closed by peer" instead of its own timeout (seen on a loaded 2-core machine)."""
    previous = dist.get_debug_level()
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        group = _short_group(timeout * (SKIPPER_WAITS if rank == skipping else 1))
    finally:
        dist.set_debug_level(previous)
    error, log = None, []
    with _stderr_into(log):  # gloo's C++ log: returned, not printed
        try:
            if rank != skipping:
                dist.all_reduce(torch.ones(4), group=group)
            dist.barrier(group=group)
        except RuntimeError as caught:
            error = caught
    # Every rank stays until all have given up: a rank that left first would close
    # the connection its peer still waits on, and the peer's error would depend on
    # which came first. The default group keeps spawn's long timeout.
    dist.barrier()
    return {**_outcome(rank, error), "log": log}


@contextlib.contextmanager
def _stderr_into(lines: list[str]) -> Iterator[None]:
    """Send file descriptor 2 (C++ logs included) to a temporary file meanwhile,
    then append its lines to ``lines``, without their time-stamped prefixes."""
    with tempfile.TemporaryFile() as file:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            text = file.read().decode("utf-8", "replace")
            for line in text.splitlines():
                lines.append(
                    re.sub(r"^(\[rank\d+\]:)?\[[A-Z]\d{4} [^\]]*\] ", "", line)
                )
