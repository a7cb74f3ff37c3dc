"""Why a launch failed, before a fix is chosen: 127.0.0.1 refusing connections (the
loopback interface down, a firewall), a launch that started but did not finish in
time (a busy machine), or gloo's host name pointing away from this machine."""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Mapping

from multigpu.doctor.machine import usable_cores
from multigpu.doctor.network import (
    bindable_address,
    loopback_error,
    loopback_fix,
    loopback_up_fix,
)

AGAIN = ", then run the doctor again"
ASK = "paste this output and the log it names to your instructor"


def load_average() -> float | None:
    """The machine's load average over the last minute (processes running or
    waiting for a core); None where the platform does not say (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def slow_text(
    load: Callable[[], float | None] = load_average,
    cores: Callable[[], int] = usable_cores,
) -> tuple[str, str]:
    """(what was measured, the fix) for a launch too slow for its time limit."""
    average, count = load(), cores()
    if average is None:
        return "", "close other busy programs" + AGAIN
    busy = f"the load average is {average:.1f} on {count} core{'s' * (count != 1)}"
    if average >= count:
        return f"; {busy}: this machine is busy", "close other busy programs" + AGAIN
    return f"; {busy}", f"run the doctor again; if it fails again, {ASK}"


def gloo_address_elsewhere(env: Mapping[str, str] = os.environ) -> str | None:
    """The address gloo binds when GLOO_SOCKET_IFNAME is not set, where that is
    not a loopback address (a network a firewall may close); None otherwise."""
    if env.get("GLOO_SOCKET_IFNAME"):
        return None
    try:
        address = bindable_address(socket.gethostname())
    except OSError:  # does not resolve: gloo falls back to 127.0.0.1
        return None
    if address is None or ipaddress.ip_address(address.split("%")[0]).is_loopback:
        return None
    return address


def launch_failure(
    what: str,
    error: str,
    unfinished: float | None,
    platform: str = sys.platform,
    connect: Callable[[], OSError | None] = loopback_error,
    slow: Callable[[], tuple[str, str]] = slow_text,
    elsewhere: Callable[[], str | None] = gloo_address_elsewhere,
) -> tuple[str, str]:
    """(what was measured, the fix) for the launch ``what`` that failed with
    ``error`` (one line); ``unfinished``: its time limit in seconds when it started
    but did not finish within it, else None. The causes are tried in order: 127.0.0.1
    refuses connections, the launch was too slow, gloo binds a non-loopback
    address; otherwise the fix is to ask."""
    refused = connect()
    if refused is not None:
        return (
            f"{what} failed ({error}): nothing can connect to 127.0.0.1 ({refused})",
            loopback_up_fix(refused, platform) + AGAIN,
        )
    if unfinished is not None:
        measured, fix = slow()
        return (
            f"the launch of {what} started but did not finish within {unfinished:g} s"
            f"{measured}; "
            "127.0.0.1 connects: not a network fault",
            fix,
        )
    address = elsewhere()
    if address is not None:
        return (
            f"{what} failed: {error} (gloo binds {address}, the host name's address)",
            loopback_fix(platform) + AGAIN,
        )
    return f"{what} failed: {error}", ASK
