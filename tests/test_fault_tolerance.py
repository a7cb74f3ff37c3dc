"""Snapshots, restarts after a killed rank, hangs and two nodes (notebook 11).

The runs kill real processes: every one is bounded by a timeout, and
``no_leftovers`` checks the process table afterwards for any process whose command
line names the test's folder. Models and data are float64, so "equal" means equal
to ~1e-12. Set ``MULTIGPU_SLOW=1`` to also run the restart ten times in a row.
"""

import random
import time

import numpy as np
import psutil
import pytest
import torch

from multigpu import ddp, faults, snapshot
from multigpu.core.data import get_dataset, tensors
from multigpu.core.models import ConvNet
from multigpu.core.reproducibility import set_seed
from multigpu.core.train import TrainConfig
from multigpu.runtime.launch import spawn

SAMPLES = 512  # 8 steps of 64 per epoch
EPOCHS = 3  # 24 steps
EVERY = 5  # a snapshot every 5 steps
SCRIPT = ["--samples", SAMPLES, "--epochs", EPOCHS, "--float64"]
SCRIPT += ["--snapshot-every", EVERY]
RUN_TIMEOUT = 240.0  # one torchrun run, restart included, on a busy 2-core machine


def _weights_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-12)


def _processes_naming(text):
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
    while _processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_naming(str(tmp_path)) == []


def _script_problem(samples=SAMPLES, epochs=EPOCHS):
    """What ``python -m multigpu.ddp --float64 --samples N`` trains, built here."""
    config = TrainConfig(epochs=epochs)
    set_seed(config.seed)
    model = ConvNet().double()
    X, y = tensors(get_dataset("digits", train=True))
    return model, X[:samples].double(), y[:samples], config


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final weights of an uninterrupted 2-rank run of the same problem."""
    model, X, y, config = _script_problem()
    folder = str(tmp_path_factory.mktemp("uninterrupted"))
    histories = spawn(
        snapshot.snapshot_worker, 2, model, X, y, config, folder, EVERY, timeout=60
    )
    return histories[0].parameters


# ----------------------------------------------------------------------------------
# Snapshots, in one process


def _sampler(num_replicas=2, rank=0, seed=0):
    return snapshot.ResumableSampler(
        range(20), num_replicas=num_replicas, rank=rank, seed=seed
    )


def test_resumable_sampler_continues_with_the_indices_not_yet_used():
    sampler = _sampler()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        full = list(sampler)
        for start in (0, 3, 10):
            sampler.set_epoch(epoch, start=start)
            assert list(sampler) == full[start:]
            assert len(sampler) == len(full) - start
    assert len(set(map(tuple, [full, list(_sampler(rank=1))]))) == 2
    with pytest.raises(ValueError, match="outside this rank's 10 indices"):
        sampler.set_epoch(0, start=11)


def test_rng_state_survives_a_snapshot_file(tmp_path):
    set_seed(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    path = tmp_path / "snapshot.pt"
    position = snapshot.Position(epoch=1, step=2, global_step=7)
    snapshot.save_snapshot(path, model, optimizer, position, _sampler(), {"x": [1.5]})
    draws = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    loaded, mine = snapshot.load_snapshot(path, fresh, fresh_optimizer, _sampler())
    assert loaded == position and mine == {"x": [1.5]}
    assert torch.equal(torch.rand(3), draws[0])
    assert np.array_equal(np.random.rand(3), draws[1])
    assert [random.random() for _ in range(3)] == draws[2]
    _weights_equal(fresh.state_dict(), model.state_dict())
    momentum = fresh_optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_no_snapshot_means_the_start(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    found = snapshot.load_snapshot(tmp_path / "none.pt", model, optimizer, _sampler())
    assert found == (snapshot.Position(), {})


def test_a_snapshot_from_another_world_size_is_refused(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "snapshot.pt"
    snapshot.save_snapshot(path, model, optimizer, snapshot.Position(), _sampler())
    with pytest.raises(snapshot.SnapshotMismatchError, match="2 as its ranks"):
        snapshot.load_snapshot(path, model, optimizer, _sampler(num_replicas=4))
    with pytest.raises(snapshot.SnapshotMismatchError, match="same sampler seed"):
        snapshot.load_snapshot(path, model, optimizer, _sampler(seed=1))


def test_the_script_refuses_options_that_do_not_go_together(capsys):
    for argv, words in [
        (["--kill-rank", "1", "--kill-at-step", "3"], "needs --snapshot DIR"),
        (["--snapshot", "d", "--kill-rank", "1"], "go together"),
        (["--snapshot", "d", "--amp"], "does not combine with --amp"),
        (
            ["--snapshot", "d", "--snapshot-every", "0"],
            "must be an integer of at least 1",
        ),
    ]:
        with pytest.raises(SystemExit):
            ddp.parse_args(argv)
        assert words in capsys.readouterr().err
    args = ddp.parse_args(
        ["--snapshot", "d", "--kill-rank", "1", "--kill-at-step", "3"]
    )
    assert (args.snapshot, args.kill_rank, args.kill_at_step) == ("d", 1, 3)


# ----------------------------------------------------------------------------------
# Mid-epoch resume, with ranks started by spawn


def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(
    tmp_path, uninterrupted
):
    model, X, y, config = _script_problem()
    folder = str(tmp_path)
    stopped, resumed = spawn(
        ddp.in_one_launch,
        2,
        [
            (snapshot.snapshot_worker, (model, X, y, config, folder, EVERY, 12)),
            (snapshot.snapshot_worker, (model, X, y, config, folder, EVERY)),
        ],
        timeout=60,
    )[0]
    assert len(stopped.step_loss) == 12  # then "crashed" after step 12 (epoch 2)
    assert len(resumed.step_loss) == EPOCHS * 8 - 10  # from the snapshot of step 10
    _weights_equal(resumed.parameters, uninterrupted)
    assert resumed.step_loss[:2] == stopped.step_loss[10:12]  # the same batches again


# ----------------------------------------------------------------------------------
# torchrun restarts the ranks after one is killed


def _check_restarted_run(result, folder, uninterrupted, killed_rank, kill_step):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    log = faults.restart_log(output)
    resumed_at = kill_step // EVERY * EVERY
    assert f"rank {killed_rank}: SIGKILL to itself before step {kill_step}" in log
    assert "torchrun: a worker failed, so the worker group failed" in log
    assert any(
        line.startswith(f"restart 1: resumed from the snapshot of step {resumed_at} ")
        for line in log
    ), log
    _weights_equal(faults.final_weights(folder), uninterrupted)
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
    result = faults.run_with_restarts(folder, *SCRIPT, *fault, timeout=RUN_TIMEOUT)
    _check_restarted_run(result, folder, uninterrupted, killed_rank, kill_step)
    assert snapshot.Fault(killed_rank, kill_step).marker(folder).exists()


@pytest.mark.slow  # ten restarts in a row
def test_ten_restarts_in_a_row(tmp_path, uninterrupted):
    figures = []
    for attempt in range(10):
        folder = tmp_path / f"run{attempt}"
        fault = ["--kill-rank", 1, "--kill-at-step", 13]
        result = faults.run_with_restarts(folder, *SCRIPT, *fault, timeout=RUN_TIMEOUT)
        figures.append(_check_restarted_run(result, folder, uninterrupted, 1, 13))
        assert _processes_naming(str(folder)) == []
    print("median resume_s:", sorted(f["resume_s"] for f in figures)[5])


def test_torchrun_restarts_after_a_rank_is_killed_from_outside(folder, uninterrupted):
    result, killed_at = faults.kill_rank_from_outside(
        folder, *SCRIPT, "--step-delay", "0.1", rank=1, after_step=7, timeout=240
    )
    assert result.returncode == 0, result.stdout[-3000:]
    log = faults.restart_log(result.stdout)
    assert "torchrun: a worker failed, so the worker group failed" in log
    assert any(line.startswith("restart 1: resumed from") for line in log), log
    _weights_equal(faults.final_weights(folder), uninterrupted)
    figures = snapshot.restart_figures(folder, killed_at=killed_at)
    assert 0 <= figures["steps_lost"] <= EVERY
    print("outside kill:", {k: round(v, 2) for k, v in figures.items()})


# ----------------------------------------------------------------------------------
# Hangs


def test_hangs_end_at_the_timeout_and_the_checks_name_the_culprit():
    start = time.monotonic()
    rows = spawn(
        ddp.in_one_launch,
        2,
        [
            (faults.late_rank, (1, 2.5, 1.0, False)),
            (faults.late_rank, (1, 2.5, 1.0, True)),
            (faults.skipped_collective, (1, 1.0, False)),
            (faults.skipped_collective, (1, 1.0, True)),
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


# ----------------------------------------------------------------------------------
# Two nodes on this machine


def test_two_nodes_of_two_train_like_one_node_of_four(folder, tmp_path_factory):
    script = ["--samples", 256, "--epochs", 2, "--float64", "--no-progress"]
    outputs = faults.run_nodes(
        "--snapshot", folder, "--show-ranks", *script, timeout=RUN_TIMEOUT
    )
    table = faults.rank_table_lines(outputs)
    assert table[0] == "RANK | LOCAL_RANK | GROUP_RANK | LOCAL_WORLD_SIZE | WORLD_SIZE"
    assert table[1:] == [f"{r} | {r % 2} | {r // 2} | 2 | 4" for r in range(4)]
    model, X, y, config = _script_problem(samples=256, epochs=2)
    reference = str(tmp_path_factory.mktemp("one_node"))
    one_node = spawn(
        snapshot.snapshot_worker, 4, model, X, y, config, reference, EVERY, timeout=60
    )
    _weights_equal(faults.final_weights(folder), one_node[0].parameters)
