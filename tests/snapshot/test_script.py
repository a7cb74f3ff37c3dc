"""Notebook 11's torchrun script on a snapshot folder, from a shell: a second
live run on the folder is refused in one line naming the first, and Ctrl-C ends the
first with one line instead of a traceback per rank."""

import os
import re
import signal
import socket
import time

import pytest

from multigpu import snapshot
from tests.faults.leftovers import ShellRun, run_shell

SCRIPT = "torchrun --standalone --nproc-per-node=2 -m multigpu.snapshot"
SHELL_TIMEOUT = 240  # one torchrun run from a shell on a busy 2-core machine


def wait_for(run, text, timeout):
    """Wait until ``text`` is in the run's output; fail after ``timeout`` s."""
    start = time.monotonic()
    while text not in run.output():
        if time.monotonic() - start > timeout or run.process.poll() is not None:
            pytest.fail(f"no {text!r} within {timeout} s:\n{run.output()[-3000:]}")
        time.sleep(0.1)


def test_a_second_live_run_is_refused_and_ctrl_c_is_one_line(folder):
    # exec: torchrun is the job, as in a terminal, where Ctrl-C signals its group
    first = ShellRun(
        f"exec {SCRIPT} --samples 256 --epochs 200 --step-delay 0.05 "
        f"--snapshot {folder}",
        cwd=folder,
    )
    try:
        wait_for(first, "snapshot of step 5 saved", timeout=180)
        code, second = run_shell(  # one rank is enough to be refused, and cheaper
            f"{SCRIPT.replace('=2', '=1')} --samples 256 --epochs 1 "
            f"--snapshot {folder}",
            SHELL_TIMEOUT,
            cwd=folder,
        )
        torchrun, rank0 = first.process.pid, first.ranks()[0]
        os.killpg(first.process.pid, signal.SIGINT)  # Ctrl-C
        first_code = first.wait(timeout=time.monotonic() - first.started + 60)
        output, left = first.output(), first.leftovers()
    finally:
        first.stop()
    errors = [
        line for line in second.splitlines() if line.startswith(("error: ", "rank "))
    ]
    assert len(errors) == 1, second[-3000:]
    assert errors[0].startswith(
        f"error: The snapshot folder {folder} is in use by another run: torchrun "
        f"(process {torchrun}) on host {socket.gethostname()}, since "
    )
    assert f", whose rank 0 is process {rank0}. " in errors[0]
    assert errors[0].endswith(
        f"stop it (kill {torchrun}), or pass another snapshot folder."
    )
    assert "exitcode  : 2" in second and code == 1
    assert not any(line.startswith("[rank") for line in second.splitlines())
    started = [e for e in snapshot.read_events(folder) if e["event"] == "started"]
    assert len(started) == 1  # the second run wrote nothing in the folder

    assert left == [] and first_code != 0
    lines = output.splitlines()
    said = [line for line in lines if line.startswith("interrupted")]
    assert len(said) == 1, output[-3000:]
    found = re.fullmatch(
        r"interrupted at step (\d+); the last snapshot is step (\d+), which a "
        r"rerun resumes from",
        said[0],
    )
    assert found, said
    step, saved = int(found[1]), int(found[2])
    assert 5 <= saved <= step and saved % 5 == 0
    assert f"snapshot of step {saved} saved" in lines
    assert "KeyboardInterrupt" not in output
    assert not any(line.startswith(("[rank", "rank ")) for line in lines)
    assert (folder / snapshot.LOCK_FILE).read_text() == ""  # let go on the way out
