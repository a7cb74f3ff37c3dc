"""No process of a run may outlive its test: the runs kill real processes, and every
one is bounded by a timeout."""

import time

import psutil
import pytest


def processes_naming(text):
    """Live processes whose command line contains ``text``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(process.info["cmdline"] or []):
                found.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def folder(tmp_path):
    """The run's snapshot folder; no process naming it may outlive the test."""
    yield tmp_path
    deadline = time.monotonic() + 10.0
    while processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(str(tmp_path)) == []
