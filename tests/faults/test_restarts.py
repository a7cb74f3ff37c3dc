"""Restarts after a killed rank (notebook 11).

The runs kill real processes: every one is bounded by a timeout, and the ``folder``
fixture checks the process table afterwards for any process whose command line names
the test's folder. Models and data are float64, so "equal" means equal to ~1e-12.
Set ``MULTIGPU_SLOW=1`` to also run the restart ten times in a row, through
``run_with_restarts`` and as the script's docstring prints it, from a shell.
"""

import pytest

import multigpu.snapshot.__main__ as snapshot_main
from multigpu import faults, snapshot
from tests.faults.leftovers import processes_naming, run_shell
from tests.snapshot.problem import EPOCHS, EVERY, SAMPLES, weights_equal

SCRIPT = ["--samples", SAMPLES, "--epochs", EPOCHS, "--float64"]
SCRIPT += ["--snapshot-every", EVERY]
RUN_TIMEOUT = 240.0  # one torchrun run, restart included, on a busy 2-core machine


def _check_restarted_run(result, folder, uninterrupted, killed_rank, kill_step):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    log = faults.restart_log(output)
    resumed_at = kill_step // EVERY * EVERY
    assert f"rank {killed_rank}: SIGKILL to itself after step {kill_step}" in log
    assert "torchrun: a worker failed, so the worker group failed" in log
    assert any(
        line.startswith(f"restart 1: resumed from the snapshot of step {resumed_at} ")
        for line in log
    ), log
    weights_equal(faults.final_weights(folder), uninterrupted)
    figures = snapshot.restart_figures(folder)
    assert figures["steps_lost"] == kill_step - resumed_at
    assert 0 <= figures["detect_s"] <= figures["restart_s"] <= figures["resume_s"]
    print("restart figures:", {k: round(v, 2) for k, v in figures.items()})
    return figures


# The default suite restarts twice (here, and killed from outside below); rank 0's
# death, which takes the workers' store with it, with MULTIGPU_SLOW=1.
@pytest.mark.parametrize(
    "killed_rank, kill_step",
    [
        (1, 13),
        pytest.param(0, 7, marks=pytest.mark.slow),
    ],
)
def test_torchrun_restarts_after_a_rank_kills_itself(
    folder, uninterrupted, killed_rank, kill_step
):
    fault = ["--kill-rank", killed_rank, "--kill-at-step", kill_step]
    result = faults.run_with_restarts(folder, *SCRIPT, *fault, deadline=RUN_TIMEOUT)
    _check_restarted_run(result, folder, uninterrupted, killed_rank, kill_step)
    assert snapshot.Fault(killed_rank, kill_step).marker(folder).exists()


@pytest.mark.slow  # ten restarts in a row
def test_ten_restarts_in_a_row(tmp_path, uninterrupted):
    figures = []
    for attempt in range(10):
        folder = tmp_path / f"run{attempt}"
        fault = ["--kill-rank", 1, "--kill-at-step", 13]
        result = faults.run_with_restarts(folder, *SCRIPT, *fault, deadline=RUN_TIMEOUT)
        figures.append(_check_restarted_run(result, folder, uninterrupted, 1, 13))
        assert processes_naming(str(folder)) == []
    print("median resume_s:", sorted(f["resume_s"] for f in figures)[5])


def test_torchrun_restarts_after_a_rank_is_killed_from_outside(folder, uninterrupted):
    result, killed_at = faults.kill_rank_from_outside(
        folder, *SCRIPT, "--step-delay", "0.1", rank=1, after_step=7, deadline=240
    )
    assert result.returncode == 0, result.stdout[-3000:]
    log = faults.restart_log(result.stdout)
    assert "torchrun: a worker failed, so the worker group failed" in log
    assert any(line.startswith("restart 1: resumed from") for line in log), log
    weights_equal(faults.final_weights(folder), uninterrupted)
    figures = snapshot.restart_figures(folder, killed_at=killed_at)
    assert 0 <= figures["steps_lost"] <= EVERY
    print("outside kill:", {k: round(v, 2) for k, v in figures.items()})


# The restart command of the script's docstring, pasted into a shell ten times.
RESTART_COMMAND = (
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 "
    "--max-restarts=3 -m multigpu.snapshot --snapshot DIR --snapshot-every 5 "
    "--kill-rank 1 --kill-at-step 13"
)


@pytest.mark.slow  # ten restarts of 5 epochs from a shell: minutes
def test_the_docstring_restart_command_resumes_ten_times_in_a_row(tmp_path):
    assert RESTART_COMMAND in " ".join(snapshot_main.__doc__.replace("\\", " ").split())
    outcomes = []
    for attempt in range(10):
        folder = tmp_path / f"run{attempt}"
        code, output = run_shell(
            RESTART_COMMAND.replace("DIR", str(folder)), 600, cwd=tmp_path
        )
        resumed = "restart 1: resumed from the snapshot of step 10 " in output
        agree = output.splitlines()[-1:] == ["every rank holds the same weights: True"]
        outcomes.append(code == 0 and resumed and agree)
    print(f"restart command: {sum(outcomes)} of 10 resumed and finished")
    assert all(outcomes), outcomes


def test_the_restart_log_leaves_out_the_survivor_s_error_line():
    """A surviving rank prints ``rank R: <error>`` when its collective fails before
    torchrun stops it, or nothing when torchrun's SIGTERM comes first: the story
    leaves it out, so that it is the same on every run."""
    output = (
        "rank 1: SIGKILL to itself after step 13\n"
        "rank 0: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
        "closed by peer [127.0.0.1]:41234\n"
        "restart 1: resumed from the snapshot of step 10 (epoch 1, step 10 of 22)\n"
    )
    assert faults.restart_log(output) == [
        "rank 1: SIGKILL to itself after step 13",
        "restart 1: resumed from the snapshot of step 10 (epoch 1, step 10 of 22)",
    ]
