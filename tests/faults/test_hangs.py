"""Hangs end at the timeout, and the checks name the culprit (notebook 11)."""

import time

from multigpu.ranks.faults import late_rank, skipped_collective_rank
from multigpu.runtime.launch import in_one_launch, spawn


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
