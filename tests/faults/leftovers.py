"""No process of a run may outlive its test: the runs kill real processes, and every
one is bounded by a timeout. :func:`run_shell` runs a command as a learner pastes
it into a shell, bounded, and kills whatever it started, stopped ranks included."""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

MARKER = "MULTIGPU_TEST_RUN"  # in the environment of every process a shell run starts


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


def marked_processes(run_id):
    """Live processes whose environment holds ``MULTIGPU_TEST_RUN=run_id``: the
    shell, torchrun and its ranks, whatever session they moved to."""
    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(MARKER) == run_id:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def kill_marked(run_id):
    """SIGCONT (a stopped rank takes no other signal but SIGKILL) then SIGKILL to
    every process of the run; wait until they are gone (10 s at most)."""
    processes = marked_processes(run_id)
    for process in processes:
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                process.send_signal(signum)
            except psutil.NoSuchProcess:
                pass
    psutil.wait_procs(processes, timeout=10)


def shell_environment(run_id):
    """This environment as a learner's shell has it: torchrun on the PATH, no
    variable of torchrun's set, and the run's marker."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCH_", "TORCHELASTIC_")) and k not in ("RANK",)
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env[MARKER] = run_id
    return env


class ShellRun:
    """A shell command running in the background; its output goes to a file."""

    def __init__(self, command, cwd):
        self.run_id = uuid.uuid4().hex
        self.log = tempfile.TemporaryFile("w+", encoding="utf-8")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            shell=True,
            cwd=cwd,
            env=shell_environment(self.run_id),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def ranks(self):
        """Process id of each rank started so far, by rank."""
        found = {}
        for process in marked_processes(self.run_id):
            try:
                rank = process.environ().get("RANK")
            except psutil.NoSuchProcess:
                continue
            if rank is not None:
                found[int(rank)] = process.pid
        return found

    def wait(self, timeout):
        """The exit status; fail the test if the run is still going after
        ``timeout`` seconds from its start."""
        left = timeout - (time.monotonic() - self.started)
        try:
            return self.process.wait(max(left, 0.1))
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"still running after {timeout} s (stopped); its output ends:\n"
                + self.output()[-3000:]
            )

    def leftovers(self, grace=5.0):
        """Processes of the run still alive ``grace`` seconds after it ended."""
        deadline = time.monotonic() + grace
        while marked_processes(self.run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [p.pid for p in marked_processes(self.run_id)]

    def stop(self):
        """Kill every process of the run, stopped ones included."""
        kill_marked(self.run_id)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.log.close()


def run_shell(command, timeout, cwd=None):
    """Run ``command`` with ``/bin/sh -c`` as a learner's shell would, bounded by
    ``timeout`` seconds; return (exit status, stdout and stderr together). Nothing
    it started is left behind."""
    run = ShellRun(command, cwd)
    try:
        code = run.wait(timeout)
        left, output = run.leftovers(), run.output()
    finally:
        run.stop()
    assert left == [], f"processes left behind: {left}"
    return code, output


@pytest.fixture
def folder(tmp_path):
    """The run's snapshot folder; no process naming it may outlive the test."""
    yield tmp_path
    deadline = time.monotonic() + 10.0
    while processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(str(tmp_path)) == []
