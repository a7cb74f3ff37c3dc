"""The browser run's set-up: one JupyterLab server on a temporary copy of
``notebooks/`` and one headless Chromium page for the whole session, and a table of
every notebook's Run All (seconds, result) at the end of the run."""

from __future__ import annotations

import os

import pytest

from tests.browser.lab import Lab, LabServer, copy_notebooks
from tests.chromium import chromium_missing, find_chromium

OPT_IN = "MULTIGPU_BROWSER"
RESULTS: list[tuple[str, float, str]] = []  # (notebook, Run All seconds, result)


def skip_reason() -> str | None:
    """Why the browser run cannot happen here (None when it can)."""
    if os.environ.get(OPT_IN) != "1":
        return f"the browser run is `make test-browser` (sets {OPT_IN}=1)"
    return chromium_missing()


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("jupyterlab")
    server = LabServer(copy_notebooks(tmp_path_factory.mktemp("served")), state)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lab(lab_server):
    page = Lab(lab_server, *find_chromium())
    page.load()
    yield page
    page.quit()


@pytest.fixture(scope="session")
def browser_results():
    return RESULTS


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    terminalreporter.section("JupyterLab Run All in headless Chromium")
    for notebook, seconds, result in RESULTS:
        terminalreporter.write_line(f"{notebook:42} {seconds:7.1f} s  {result}")
