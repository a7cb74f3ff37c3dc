"""What the snapshot loop refuses and says, with ranks started by spawn (notebook
11): a finished run started again, another lr or momentum, a folder another live
run holds, and Ctrl-C. One launch runs them all, one after the other."""

import dataclasses
import json
import os
import socket
import subprocess
import sys

import pytest

from multigpu import snapshot
from multigpu.runtime.launch import in_one_launch, spawn
from tests.snapshot.problem import script_problem
from tests.snapshot.ranks import logged_snapshot_rank

EVERY = 2  # 256 samples, global batch 64: 4 steps per epoch, 8 in 2 epochs


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{name: rank 0's outcome}, and the folders, of one launch of 2 ranks."""
    model, X, y, config = script_problem(samples=256, epochs=2)
    folders = {
        name: tmp_path_factory.mktemp(name)
        for name in ("finished", "interrupted", "locked")
    }
    run = (model, X, y, config)
    calls = {
        "finished": (*run, folders["finished"], EVERY),
        "again": (*run, folders["finished"], EVERY),
        "other lr": (
            model,
            X,
            y,
            dataclasses.replace(config, lr=0.5),
            folders["finished"],
            EVERY,
        ),
        "interrupted": (*run, folders["interrupted"], EVERY, 6),
        "resumed": (*run, folders["interrupted"], EVERY),
        "locked": (*run, folders["locked"], EVERY),
    }
    held = snapshot.lock_folder(folders["locked"])  # another live run: this process
    try:
        per_rank = spawn(
            in_one_launch,
            2,
            [(logged_snapshot_rank, arguments) for arguments in calls.values()],
            timeout=60,
        )
    finally:
        held.release()
    for rank_results in per_rank[1:]:  # every rank stops alike
        for mine, rank0 in zip(rank_results, per_rank[0]):
            assert (mine["steps"], mine["error"]) == (rank0["steps"], rank0["error"])
    return dict(zip(calls, per_rank[0])), folders


def test_a_finished_run_started_again_says_so_and_trains_nothing(outcomes):
    results, _ = outcomes
    assert results["finished"]["steps"] == 8
    again = results["again"]
    assert again["steps"] == 0 and again["error"] is None
    assert again["lines"] == [
        "restart 0: the run is already complete: its snapshot of step 8 ends epoch "
        "2, and this run asks for 2 epoch(s), so there is nothing to train. Use a "
        "new snapshot folder to train again, or more epochs to train on."
    ]


def test_another_lr_is_refused_by_name(outcomes):
    results, _ = outcomes
    assert results["other lr"]["error"] == (
        "SnapshotMismatchError",
        "snapshot.pt was written by a run with 0.05 as its optimizer's lr, and this "
        "run has 0.5, so the resumed run would train with 0.05, not 0.5. Resume "
        "with the same optimizer's lr, or start afresh in a new snapshot folder.",
    )


def test_ctrl_c_says_where_the_run_stood_and_the_run_resumes(outcomes):
    results, _ = outcomes
    assert results["interrupted"]["error"] == (
        "Interrupted",
        "interrupted at step 6; the last snapshot is step 4, which a rerun "
        "resumes from",
    )
    resumed = results["resumed"]  # the lock was let go: the next run takes it
    assert resumed["lines"][0] == (
        "restart 0: resumed from the snapshot of step 4 (epoch 2, step 0 of 4)"
    )
    assert resumed["steps"] == 4


def test_a_folder_another_live_run_holds_is_refused_before_it_is_touched(outcomes):
    results, folders = outcomes
    kind, message = results["locked"]["error"]
    assert kind == "SnapshotInUseError"
    assert message.startswith(
        f"The snapshot folder {folders['locked']} is in use by another run: process "
        f"{os.getpid()} on host {socket.gethostname()}, since "
    )
    assert message.endswith(
        f"Wait for that run to end, or stop it (kill {os.getpid()}), or pass "
        "another snapshot folder."
    )
    assert sorted(p.name for p in folders["locked"].iterdir()) == [
        snapshot.LOCK_FILE
    ]  # no event, no snapshot: nothing read or written


def test_a_lock_is_exclusive_and_released(tmp_path):
    first = snapshot.lock_folder(tmp_path)
    with pytest.raises(snapshot.SnapshotInUseError, match="is in use by another"):
        snapshot.lock_folder(tmp_path)
    first.release()
    second = snapshot.lock_folder(tmp_path)
    assert second.previous is None  # released cleanly: no record left behind
    second.release()
    assert (tmp_path / snapshot.LOCK_FILE).read_text() == ""


def test_the_lock_of_a_killed_run_is_taken_over_and_named(tmp_path):
    """A process takes the lock, records itself, and is killed with SIGKILL: the
    kernel lets the lock go, and the next run takes it over, knowing whose it was."""
    path = str(tmp_path / snapshot.LOCK_FILE)
    killed = (
        "import fcntl, json, os, signal\n"
        f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "record = {'pid': os.getpid(), 'torchrun_pid': None, 'host': 'h', 'since': 0}\n"
        "os.write(fd, json.dumps(record).encode())\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", killed], timeout=30)
    assert done.returncode == -9
    lock = snapshot.lock_folder(tmp_path)
    try:
        assert lock.previous["pid"] > 0 and lock.previous["host"] == "h"
        assert snapshot.describe_owner(lock.previous).startswith(
            f"process {lock.previous['pid']} on host h, since "
        )
    finally:
        lock.release()


def test_the_orphaned_rank_0_of_a_killed_torchrun_is_the_process_named(tmp_path):
    """torchrun killed alone leaves its ranks running (each in its own session):
    the refusal names rank 0, the process that still holds the folder."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])  # a torchrun, ended
    assert ended.wait(30) == 0
    lock = snapshot.lock_folder(tmp_path)
    orphan = {"pid": os.getpid(), "torchrun_pid": ended.pid, "since": 0}
    orphan["host"] = socket.gethostname()
    os.ftruncate(lock.fd, 0)
    os.pwrite(lock.fd, json.dumps(orphan).encode(), 0)
    try:
        with pytest.raises(snapshot.SnapshotInUseError) as error:
            snapshot.lock_folder(tmp_path)
    finally:
        lock.release()
    assert f"process {os.getpid()} on host {socket.gethostname()}, since " in str(
        error.value
    )
    assert f"rank 0 of a torchrun (process {ended.pid}) that has ended" in str(
        error.value
    )
    assert f"stop it (kill {os.getpid()})" in str(error.value)
