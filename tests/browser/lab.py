"""JupyterLab in headless Chromium, driven as a participant drives it.

``LabServer`` starts ``jupyter lab`` from the environment running the tests (the
project's ``.venv`` under ``make test-browser``) on a copy of ``notebooks/`` in a
temporary folder, so the committed notebooks are never written. ``Lab`` opens it in
Chromium through selenium with ``window.jupyterapp`` exposed
(``--LabApp.expose_app_in_browser``) and runs a notebook with JupyterLab's own
``notebook:run-all-cells`` command, then saves it and reads it back through the
server's contents API.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabServer:
    """``jupyter lab`` serving ``root`` on a free port with a random token."""

    def __init__(self, root: Path, state: Path):
        self.root, self.state = root, state
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = state / "jupyterlab.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        jupyter = Path(sys.executable).parent / "jupyter"
        command = [
            str(jupyter), "lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.expose_app_in_browser=True",
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--allow-root")
        return command

    def environment(self) -> dict[str, str]:
        """The caller's environment (``make``'s thread settings included), with
        Jupyter's user settings, workspaces and runtime files kept in ``state``."""
        env = dict(os.environ)
        for name in ("CONFIG", "RUNTIME"):
            env[f"JUPYTER_{name}_DIR"] = str(self.state / name.lower())
        env["JUPYTERLAB_SETTINGS_DIR"] = str(self.state / "settings")
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(self.state / "workspaces")
        return env

    def start(self, timeout: float = 120) -> None:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited:\n{self.log_tail()}")
            try:
                self.api("status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        raise RuntimeError(f"jupyter lab did not answer in {timeout} s")

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(
            f"{self.url}/api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def read_notebook(self, name: str):
        """The notebook as the server stores it now (contents API)."""
        model = self.api(f"contents/{name}?type=notebook&content=1")
        return nbformat.reads(json.dumps(model["content"]), as_version=4)

    def kernel_python(self) -> str:
        """The interpreter the server's default kernelspec starts."""
        specs = self.api("kernelspecs")
        return specs["kernelspecs"][specs["default"]]["spec"]["argv"][0]

    def shutdown_kernels(self) -> None:
        """Shut every kernel down (what a failed run left running)."""
        for kernel in self.api("kernels"):
            self.api(f"kernels/{kernel['id']}", method="DELETE")

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # the server shuts its kernels down
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def copy_notebooks(destination: Path) -> Path:
    """A copy of ``notebooks/`` to run, without checkpoints."""
    target = destination / "notebooks"
    shutil.copytree(
        ROOT / "notebooks",
        target,
        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
    )
    return target


# JavaScript run in the page. `window.__run` holds the notebook being run.
OPEN = """
const [path, done] = [arguments[0], arguments[arguments.length - 1]];
(async () => {
  const app = window.jupyterapp;
  await app.restored;
  for (const widget of Array.from(app.shell.widgets('main'))) widget.dispose();
  const panel = await app.commands.execute(
    'docmanager:open', {path: path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  app.shell.activateById(panel.id);
  window.__run = {panel: panel, result: null, error: null};
  done({kernel: panel.sessionContext.session.kernel.name});
})().catch(error => done({error: String(error && error.stack || error)}));
"""
RUN_ALL = """
const run = window.__run;
window.jupyterapp.shell.activateById(run.panel.id);
window.jupyterapp.commands.execute('notebook:run-all-cells').then(
  result => { run.result = String(result); },
  error => { run.error = String(error && error.stack || error); });
"""
STATE = """
const run = window.__run;
const kernel = run.panel.sessionContext.session?.kernel;
const cells = Array.from(run.panel.content.model.cells);
return {
  kernel: kernel ? kernel.status : 'none',
  result: run.result,
  error: run.error,
  running: cells.filter(c => c.type === 'code' && c.executionState === 'running')
    .length,
  unrun: cells.filter(c => c.type === 'code' && c.executionCount === null).length,
};
"""
SAVE_AND_CLOSE = """
const done = arguments[arguments.length - 1];
(async () => {
  const panel = window.__run.panel;
  await panel.context.save();
  await panel.sessionContext.shutdown();
  panel.dispose();
  done('saved');
})().catch(error => done(String(error)));
"""


class Lab:
    """One Chromium page on the server's JupyterLab."""

    def __init__(self, server: LabServer, browser: str, driver: str):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1400,1000",
        ):
            options.add_argument(flag)
        service = Service(
            executable_path=driver, log_output=str(server.state / "driver.log")
        )
        self.server = server
        self.driver = webdriver.Chrome(options=options, service=service)
        self.driver.set_script_timeout(180)

    def load(self, timeout: float = 180) -> None:
        self.driver.get(f"{self.server.url}/lab?reset&token={self.server.token}")
        deadline = time.monotonic() + timeout
        while not self.driver.execute_script("return !!window.jupyterapp"):
            if time.monotonic() > deadline:
                raise TimeoutError("JupyterLab did not load in the browser")
            time.sleep(0.5)

    def ready(self) -> bool:
        try:
            return bool(self.driver.execute_script("return !!window.jupyterapp"))
        except Exception:
            return False

    def open(self, name: str, timeout: float = 180) -> None:
        """Open ``name`` alone in the main area and wait for its kernel to be idle."""
        if not self.ready():
            self.load()
        answer = self.driver.execute_async_script(OPEN, name)
        if "error" in answer:
            raise RuntimeError(f"could not open {name}: {answer['error']}")
        deadline = time.monotonic() + timeout
        while (status := self.driver.execute_script(STATE)["kernel"]) != "idle":
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the kernel of {name} is {status} after {timeout} s"
                )
            time.sleep(0.5)

    def run_all(self, timeout: float, settle: float = 2.0) -> float:
        """Run All, then wait until its command has finished, no cell is running
        and the kernel has stayed idle for ``settle`` seconds. Returns the seconds
        from the command to the idle kernel."""
        start = time.monotonic()
        self.driver.execute_script(RUN_ALL)
        deadline = start + timeout
        idle_since = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            state = self.driver.execute_script(STATE)
            if state["kernel"] == "dead":
                raise RuntimeError(f"the kernel died: {state}")
            finished = state["result"] is not None or state["error"] is not None
            if finished and state["kernel"] == "idle" and not state["running"]:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since < settle:
                    continue
                if state["error"] is not None:
                    raise RuntimeError(f"Run All failed: {state['error']}")
                return idle_since - start
            else:
                idle_since = None
        raise TimeoutError(f"Run All did not finish in {timeout} s: {state}")

    def save_and_close(self) -> None:
        answer = self.driver.execute_async_script(SAVE_AND_CLOSE)
        if answer != "saved":
            raise RuntimeError(f"could not save the notebook: {answer}")

    def screenshot(self, path: Path) -> None:
        self.driver.save_screenshot(str(path))

    def quit(self) -> None:
        self.driver.quit()
