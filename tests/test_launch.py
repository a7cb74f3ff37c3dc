"""Tests for multigpu.launch: results, errors from failing ranks, no leftovers."""

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psutil
import pytest

from multigpu import launch, workers
from multigpu.launch import (
    TorchrunError,
    WorkerError,
    WorkerNotImportableError,
    run_torchrun,
    spawn,
)

TIMEOUT = 5.0  # seconds for every collective in these tests
SLACK = 10.0  # extra seconds a loaded 2-core machine may need to report


def _descendants() -> set[int]:
    """Live descendants of this test process (zombies are already dead)."""
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def no_leftovers():
    """Fail the test if a process it started outlives it."""
    spawn(workers.whoami, 1)  # starts the long-lived forkserver before the snapshot
    before = _descendants()
    yield
    assert _descendants() - before == set()


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_results_come_back_ordered_by_rank_with_limited_threads(no_leftovers):
    rows = spawn(workers.whoami, 3, timeout=TIMEOUT, threads=1)
    assert [row["rank"] for row in rows] == [0, 1, 2]
    assert [row["dist_rank"] for row in rows] == [0, 1, 2]
    assert {row["world_size"] for row in rows} == {3}
    assert {row["backend"] for row in rows} == {"gloo"}
    assert {row["threads"] for row in rows} == {1}
    assert {row["OMP_NUM_THREADS"] for row in rows} == {"1"}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives_work_inside_the_workers(world_size):
    expected = world_size * (world_size + 1) // 2
    assert spawn(workers.sum_of_ranks, world_size) == [expected] * world_size


def test_arguments_reach_every_rank_and_threads_are_configurable():
    assert spawn(workers.sum_of_ranks, 2, 10, threads=2) == [21, 21]
    rows = spawn(workers.whoami, 2, threads=2)
    assert {(row["threads"], row["OMP_NUM_THREADS"]) for row in rows} == {(2, "2")}


def test_the_caller_environment_reaches_the_workers(monkeypatch):
    monkeypatch.setenv("MULTIGPU_TEST_FLAG", "set-after-the-forkserver")
    assert spawn(workers.environment_value, 1, "MULTIGPU_TEST_FLAG") == [
        "set-after-the-forkserver"
    ]


def test_the_spawn_start_method_works_too(monkeypatch):
    monkeypatch.setattr(launch, "START_METHOD", "spawn")
    rows = spawn(workers.whoami, 2, timeout=30.0)
    assert [(row["rank"], row["threads"]) for row in rows] == [(0, 1), (1, 1)]


def _local_worker(rank, world_size):
    return rank


def test_a_worker_from_a_notebook_is_refused_before_any_process_starts():
    def nested(rank, world_size):
        return rank

    before = _descendants()
    original = _local_worker.__module__
    _local_worker.__module__ = "__main__"  # what a notebook cell's function has
    try:
        with pytest.raises(WorkerNotImportableError, match="Move it into a module"):
            spawn(_local_worker, 2)
    finally:
        _local_worker.__module__ = original
    with pytest.raises(WorkerNotImportableError, match="lambda or a nested"):
        spawn(nested, 2)
    with pytest.raises(WorkerNotImportableError, match="lambda or a nested"):
        spawn(lambda rank, world_size: rank, 2)
    assert _descendants() - before == set()


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="at least 1"):
        spawn(workers.whoami, 0)
    with pytest.raises(ValueError, match="timeout"):
        spawn(workers.whoami, 1, timeout=0)
    with pytest.raises(ValueError, match="Unknown backend"):
        spawn(workers.whoami, 1, backend="mpi")
    with pytest.raises(TypeError, match="cannot be pickled"):
        spawn(workers.sum_of_ranks, 1, (i for i in range(3)))


def test_nccl_with_more_ranks_than_gpus_is_refused():
    import torch

    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match="one GPU per rank"):
        spawn(workers.whoami, too_many, backend="nccl")


def test_a_rank_that_raises_is_named_with_its_traceback(no_leftovers):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        spawn(workers.fail_on_rank, 3, 1, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT
    error = caught.value
    assert str(error) == "Rank 1 of 3 failed with ValueError: rank 1 found a bad batch"
    assert error.rank == 1
    assert 'raise ValueError(f"rank {rank} found a bad batch")' in error.traceback
    assert not error.timed_out
    assert error.traceback in str(error.__cause__)


def test_a_rank_killed_by_sigkill_is_named(no_leftovers):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        spawn(workers.kill_rank, 3, 2, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT
    error = caught.value
    assert str(error) == "Rank 2 of 3 was killed by SIGKILL without reporting an error"
    assert (error.rank, error.exitcode) == (2, -9)
    assert not error.timed_out


def test_a_rank_that_never_joins_times_out_instead_of_hanging(no_leftovers):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        spawn(workers.skip_collective, 2, 1, 300.0, timeout=2.0)
    elapsed = time.monotonic() - start
    assert 2.0 <= elapsed < 2.0 + SLACK
    error = caught.value
    assert error.rank == 0
    assert error.timed_out
    assert error.missing_ranks == [1]
    assert "Rank(s) [1] had not reported" in str(error)


def test_ranks_that_all_wait_for_each_other_time_out(no_leftovers):
    with pytest.raises(WorkerError) as caught:
        spawn(workers.wait_for_each_other, 2, timeout=2.0)
    error = caught.value
    assert error.timed_out
    assert error.missing_ranks == []  # both reported: torch's own error said so


def test_a_timeout_is_recognised_by_kind_and_only_after_the_timeout():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    with pytest.raises(dist.DistStoreError) as caught:  # a rendezvous that never ends
        store.wait(["a key no rank sets"], timedelta(seconds=0.1))
    store_timeout = caught.value
    assert launch._is_timeout(store_timeout, waited_s=2.0, timeout=1.0)
    assert launch._is_timeout(TimeoutError(), waited_s=2.0, timeout=1.0)
    assert not launch._is_timeout(store_timeout, waited_s=0.5, timeout=1.0)
    assert not launch._is_timeout(ValueError("timed out"), waited_s=2.0, timeout=1.0)


def test_processes_a_rank_started_are_ended_too(tmp_path, no_leftovers):
    pid_file = tmp_path / "sleeper"
    with pytest.raises(WorkerError, match="after starting a subprocess"):
        spawn(workers.start_sleeper_then_fail, 2, str(pid_file), timeout=TIMEOUT)
    pids = [int((tmp_path / f"sleeper.{rank}").read_text()) for rank in range(2)]
    assert all(_gone(pid) for pid in pids)


def test_a_result_that_cannot_be_pickled_is_reported(no_leftovers):
    with pytest.raises(WorkerError, match=r"TypeError: Rank \d returned a generator"):
        spawn(workers.unpicklable_result, 2, timeout=TIMEOUT)


def test_eight_launches_at_once_do_not_clash(no_leftovers):
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(spawn, workers.sum_of_ranks, 2, offset, timeout=30.0)
            for offset in range(8)
        ]
        results = [future.result() for future in futures]
    assert results == [[2 * offset + 1] * 2 for offset in range(8)]


def test_run_torchrun_returns_the_output_of_the_ranks(no_leftovers):
    result = run_torchrun("multigpu.workers", 2, timeout=120.0)
    assert result.returncode == 0
    assert "world_size=2 sum=3 threads=1" in result.stdout


def test_run_torchrun_stops_a_run_that_takes_too_long():
    before = _descendants()
    with pytest.raises(TorchrunError, match="did not finish within 0.5 s"):
        run_torchrun("multigpu.workers", 1, timeout=0.5)
    assert _descendants() - before == set()
