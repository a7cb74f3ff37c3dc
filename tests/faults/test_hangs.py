"""Hangs end at the timeout, and the checks name the culprit (notebook 11); the
snapshot script's --timeout ends a hang from a shell."""

import contextlib
import os
import signal
import time

import pytest

from multigpu.ranks.faults import late_rank, skipped_collective_rank
from multigpu.runtime.launch import in_one_launch, spawn
from tests.faults.leftovers import ShellRun


def test_hangs_end_at_the_timeout_and_the_checks_name_the_culprit():
    start = time.monotonic()
    rows = spawn(
        in_one_launch,
        2,
        [
            (late_rank, (1, 2.5, 1.0, False)),
            (late_rank, (1, 2.5, 1.0, True)),
            (skipped_collective_rank, (1, 1.0, False)),
            (skipped_collective_rank, (1, 1.0, True)),
        ],
        timeout=60,
        deadline=120,
    )
    assert time.monotonic() - start < 120  # seconds, not the default 30 minutes
    (late0, monitored0, skipped0, detail0), (late1, monitored1, _, detail1) = rows
    assert late0["result"] == "timed out, waiting for a peer"
    assert late1["result"] != "finished"  # it came too late: its peer gave up
    assert monitored0["result"] == "monitored_barrier: rank(s) 1 did not arrive"
    log = monitored0["log"]
    assert any("Ranks 1 failed to pass monitoredBarrier" in line for line in log)
    assert monitored1["result"] != "finished"
    assert skipped0["result"] == "timed out, waiting for a peer"
    assert detail0["result"] == "collectives do not match (this rank was in ALLREDUCE)"
    assert detail1["result"] == "collectives do not match (this rank was in BARRIER)"


def _wait_for(run, text, timeout):
    """Seconds until ``text`` appears in the run's output; fail after ``timeout``."""
    start = time.monotonic()
    while text not in run.output():
        if time.monotonic() - start > timeout or run.process.poll() is not None:
            pytest.fail(f"no {text!r} within {timeout} s:\n{run.output()[-3000:]}")
        time.sleep(0.1)
    return time.monotonic() - start


TIMEOUT = 15  # the script's --timeout, in seconds


def test_the_script_s_timeout_ends_a_hang_on_a_stopped_rank(folder):
    """Rank 1 SIGSTOPped under torchrun from a shell: rank 0 fails after --timeout
    seconds with one line, instead of waiting gloo's 30 minutes."""
    # --timeout also bounds the ranks' meeting: 5 s failed once under make test's
    # load, a rank starting more than 5 s after its peer while importing torch
    run = ShellRun(
        "torchrun --standalone --nproc-per-node=2 -m multigpu.snapshot "
        f"--timeout {TIMEOUT} --samples 256 --epochs 50 --step-delay 0.05 "
        f"--snapshot {folder}",
        cwd=folder,
    )
    try:
        _wait_for(run, "snapshot of step 5 saved", timeout=180)
        stopped = run.ranks()[1]
        os.kill(stopped, signal.SIGSTOP)
        noticed = _wait_for(run, "rank 0: ", timeout=60)
        # torchrun's SIGTERM waits in a stopped rank: let it act now rather than
        # after torchrun's 30 s of grace (that grace is torchrun's, not the script's)
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)
        code = run.wait(timeout=time.monotonic() - run.started + 120)
        output = run.output()
    finally:
        run.stop()
    assert noticed < TIMEOUT + 15, noticed  # the timeout, plus a busy machine's delays
    failed = [line for line in output.splitlines() if line.startswith("rank 0: ")]
    assert len(failed) == 1 and "timed out" in failed[0].lower(), failed
    print(f"noticed {noticed:.1f} s after the stop: {failed[0]}")
    assert code != 0
