"""Shared by the tests of launch: the processes a test started, and limits."""

import time

import psutil

# Seconds for every collective in these tests, and for the rendezvous it also bounds:
# on CI's machine, running five test parts on 2 cores, 1 s was once too short for two
# ranks to connect, and the case under test never began.
TIMEOUT = 5.0
SLACK = 10.0  # extra seconds a loaded 2-core machine may need to report


def descendants() -> set[int]:
    """Live descendants of this test process (zombies are already dead)."""
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
