"""Tests for multigpu.runtime.launch: results, errors from failing ranks, deadlines, no
leftovers (not even when the caller of spawn is killed)."""

import importlib.util
import signal
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch

from multigpu import workers
from multigpu.runtime import launch
from multigpu.runtime.launch import (
    DeadlineExceededError,
    TorchrunError,
    WorkerError,
    WorkerNotImportableError,
    run_torchrun,
    spawn,
)

TIMEOUT = 5.0  # seconds for every collective in these tests
SLACK = 10.0  # extra seconds a loaded 2-core machine may need to report
ORPHAN_LIMIT_S = 2.0  # the caller died: its last rank must be gone this soon
HELPER_LIMIT_S = 5.0  # ... and the forkserver and resource tracker this soon
ROOT = Path(__file__).resolve().parents[2]


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
    with pytest.raises(ValueError) as caught:
        spawn(workers.whoami, 0)
    assert str(caught.value) == (
        "world_size must be an integer of at least 1, got 0. Ask for as many "
        "processes as you want ranks."
    )
    with pytest.raises(ValueError, match="world_size must be an integer"):
        spawn(workers.whoami, 2.0)
    with pytest.raises(ValueError) as caught:
        spawn(workers.whoami, 1, threads=0)
    assert str(caught.value) == (
        "threads must be an integer of at least 1, got 0. Pass how many CPU "
        "threads each rank may use, e.g. threads=1."
    )
    with pytest.raises(ValueError, match="threads must be an integer"):
        run_torchrun("multigpu.workers", 1, threads=True)
    with pytest.raises(ValueError, match="timeout"):
        spawn(workers.whoami, 1, timeout=0)
    with pytest.raises(ValueError, match="Unknown backend"):
        spawn(workers.whoami, 1, backend="mpi")
    with pytest.raises(TypeError, match="cannot be pickled"):
        spawn(workers.sum_of_ranks, 1, (i for i in range(3)))


def test_an_infinite_timeout_or_deadline_is_refused_with_the_way_to_say_none():
    with pytest.raises(ValueError) as caught:
        spawn(workers.whoami, 1, timeout=float("inf"))
    assert str(caught.value) == (
        "timeout=inf cannot be used: torch.distributed and the launcher need a "
        "finite number of seconds. For no timeout, pass timeout=None."
    )
    with pytest.raises(ValueError, match="For no deadline, pass deadline=None"):
        spawn(workers.whoami, 1, deadline=float("inf"))
    with pytest.raises(ValueError, match="deadline must be a positive number"):
        spawn(workers.whoami, 1, deadline=0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        spawn(workers.whoami, 1, timeout=float("nan"))
    with pytest.raises(TypeError, match="deadline must be a number of seconds"):
        spawn(workers.whoami, 1, deadline="60")


def test_timeout_none_means_no_timeout(no_leftovers):
    # Rank 1 joins the all_reduce 1.5 s late; with timeout=1 that fails.
    assert spawn(workers.join_late, 2, 1, 1.5, timeout=None) == [3, 3]
    assert launch._as_timedelta(None) >= timedelta(days=365)
    with pytest.raises(WorkerError) as caught:
        spawn(workers.join_late, 2, 1, 3.0, timeout=1.0)
    assert caught.value.timed_out


def test_far_more_ranks_than_cores_gives_a_warning(monkeypatch):
    monkeypatch.setattr(launch, "_cpu_count", lambda: 1)
    with pytest.warns(RuntimeWarning) as caught:
        rows = spawn(workers.whoami, 5)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3, 4]
    (warning,) = [w for w in caught if "world_size=5" in str(w.message)]
    assert str(warning.message) == (
        "world_size=5 starts 5 processes on 1 CPU core(s), more than 4 per core: "
        "each rank gets a small slice of a core, so the launch may crawl and its "
        "collectives may reach their timeout. Use at most 4 ranks on this "
        "machine, or raise timeout= and deadline= if you mean it."
    )
    assert warning.filename == __file__  # it points at the line that called spawn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch._warn_if_crowded(4)  # 4 per core: no warning


def test_nccl_with_more_ranks_than_gpus_is_refused():
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


def test_a_rank_stuck_outside_collectives_is_stopped_at_the_deadline(no_leftovers):
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError) as caught:
        spawn(workers.stuck_outside_collectives, 3, 1, timeout=TIMEOUT, deadline=2.0)
    elapsed = time.monotonic() - start
    assert 2.0 <= elapsed < 2.0 + SLACK
    error = caught.value
    assert isinstance(error, WorkerError)
    assert str(error) == (
        "The launch did not finish within its deadline of 2 s: rank 1 of 3 still "
        "running (ranks 0 and 2 had returned). Every rank has been stopped. A rank "
        "stuck outside any collective (an endless loop, a blocking read) is caught "
        "by the deadline, not by the timeout: error.traceback shows where rank 1 "
        "was. If the work just needs longer, pass a larger deadline= (None for no "
        "deadline)."
    )
    assert (error.rank, error.exitcode, error.deadline) == (1, None, 2.0)
    assert error.timed_out
    assert (error.missing_ranks, error.returned_ranks) == ([1], [0, 2])
    # Where it was stuck: its Python stack, dumped at the deadline.
    assert "in stuck_outside_collectives" in error.traceback
    assert error.traceback in str(error.__cause__)


def test_without_a_deadline_argument_a_stuck_launch_is_still_stopped(
    no_leftovers, monkeypatch
):
    # spawn binds its default deadline when it is defined, so patching the module's
    # constant would not reach it: instead the parent's clock runs 1000 times fast
    # (the ranks keep the real one). The default of 300 s then passes in 0.3 s; a
    # default of None, or of more than an hour, would let the sleeping rank return
    # after its 5 s, and spawn would return [-1] instead of raising.
    real = time.monotonic
    started = real()
    fast_clock = type(time)("fast_clock")
    fast_clock.monotonic = lambda: started + 1000 * (real() - started)
    monkeypatch.setattr(launch, "time", fast_clock)
    with pytest.raises(DeadlineExceededError) as caught:
        spawn(workers.skip_collective, 1, 0, 5.0)  # rank 0 sleeps 5 s, then returns
    assert real() - started < 5.0  # stopped before the rank could return
    error = caught.value
    assert error.deadline == launch.DEFAULT_DEADLINE_S
    assert str(error).startswith(
        f"The launch did not finish within its deadline of "
        f"{launch.DEFAULT_DEADLINE_S:g} s: rank 0 of 1 still running."
    )
    assert error.missing_ranks == [0]


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


def test_a_result_that_cannot_be_unpickled_here_is_attributed_to_its_rank(
    no_leftovers,
):
    with pytest.raises(WorkerError) as caught:
        spawn(workers.result_that_fails_to_unpickle, 2, 1, timeout=TIMEOUT)
    error = caught.value
    assert str(error) == (
        "Rank 1 of 2 returned a value that cannot be unpickled in this process "
        "(ValueError: this object cannot be rebuilt outside the rank). Return "
        "tensors, numbers, strings, lists or dicts, or objects of classes that this "
        "process can import and rebuild."
    )
    assert error.rank == 1
    assert "in _refuse_to_unpickle" in error.traceback


def test_a_rank_that_returns_while_a_peer_waits_is_a_collective_mismatch(
    no_leftovers,
):
    # Rank 1 returns at once; rank 0 waits in an all_reduce that rank 1 never joins.
    with pytest.raises(WorkerError) as caught:
        spawn(workers.skip_collective, 2, 1, 0.0, timeout=TIMEOUT)
    error = caught.value
    assert str(error) == (
        "Rank 0 of 2 was still in a collective when rank 1 returned normally from "
        "the worker: the ranks called different collectives (a collective "
        "mismatch). Every rank must call the same collectives in the same order; "
        "look for one that only some ranks reach (a branch on the rank, an early "
        "return, a loop whose length differs). torch.distributed's own error is in "
        "error.traceback"
    )
    assert (error.rank, error.returned_ranks, error.missing_ranks) == (0, [1], [])
    assert not error.timed_out
    assert "gloo" in error.traceback  # torch's own words are kept there


def test_tensors_of_different_sizes_show_gloos_own_words(no_leftovers, capfd):
    with pytest.raises(WorkerError) as caught:
        spawn(workers.mismatched_shapes, 2, timeout=TIMEOUT)
    error = caught.value
    assert (error.rank, error.exitcode) == (0, -signal.SIGABRT)
    gloo = "Received data size doesn't match expected size."
    lines = str(error).splitlines()
    assert lines[0] == (
        "Rank 0 of 2 was killed by SIGABRT without reporting an error. Its stderr "
        "ends with:"
    )
    assert "gloo::EnforceNotMet" in lines[1]
    assert lines[2].startswith("      what():  [enforce fail at ")
    assert lines[2].endswith(
        f"8 vs 4. {gloo} Is there a distributed collective mismatch in your code?"
    )
    assert gloo in error.stderr and gloo in error.traceback
    assert gloo in capfd.readouterr().err  # what ranks print still reaches stderr


def test_a_worker_that_calls_os_exit_gets_its_own_message(no_leftovers):
    with pytest.raises(WorkerError) as caught:
        spawn(workers.exit_without_returning, 2, 1, timeout=TIMEOUT)
    error = caught.value
    assert str(error) == (
        "Rank 1 of 2 exited with code 0 while its worker was running, without "
        "returning or raising: the worker, or something it called, ended the "
        "process (for example with os._exit(0)). A worker must return its result "
        "or raise an exception"
    )
    assert (error.rank, error.exitcode, error.returned_ranks) == (1, 0, [0])


def test_an_exception_whose_text_fails_is_still_reported(no_leftovers):
    with pytest.raises(WorkerError) as caught:
        spawn(workers.raise_unprintable, 2, 1, timeout=TIMEOUT)
    error = caught.value
    assert str(error) == (
        "Rank 1 of 2 failed with UnprintableError, whose message cannot be shown: "
        "str() of it raised RuntimeError: this exception cannot be turned into text"
    )
    assert (error.rank, error.exitcode) == (1, None)
    assert "raise UnprintableError()" in error.traceback


def test_the_main_guard_hint_is_kept_for_a_rank_that_died_before_its_worker():
    failure = launch._Failure(rank=1, exitcode=1, started=False)
    assert failure.describe(2)[0] == (
        "Rank 1 of 2 exited with code 1 before it could report (see its stderr; a "
        "script that calls spawn needs an `if __name__ == '__main__':` guard)"
    )
    failure.started = True
    assert "__main__" not in failure.describe(2)[0]


def _orphans():
    """bench/orphans.py: kill the caller of spawn, time how long its ranks live."""
    if "bench_orphans" not in sys.modules:
        path = ROOT / "bench" / "orphans.py"
        spec = importlib.util.spec_from_file_location("bench_orphans", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_orphans"] = module  # its dataclass looks itself up there
        spec.loader.exec_module(module)
    return sys.modules["bench_orphans"]


def _check_no_orphans(result) -> None:
    print(result)  # the measured seconds (pytest -s shows them)
    assert result.left == []
    assert result.helpers  # at least the forkserver, which must go too
    assert result.ranks_gone_s < ORPHAN_LIMIT_S
    assert result.all_gone_s < HELPER_LIMIT_S


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_ranks_end_when_the_script_that_called_spawn_is_killed(how, tmp_path):
    _check_no_orphans(_orphans().kill_a_script(how, tmp_path))


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_ranks_end_when_the_jupyter_kernel_that_called_spawn_is_killed(how, tmp_path):
    _check_no_orphans(_orphans().kill_a_kernel(tmp_path, how=how))


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


needs_proc = pytest.mark.skipif(
    workers.native_threads() is None, reason="counts threads via /proc"
)


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@needs_proc
def test_ddp_keeps_the_gloo_threads_after_destroy_process_group(no_leftovers):
    # The first link in exit_rank's chain of causes: once DDP was built, the
    # group's worker threads outlive destroy_process_group (and a garbage
    # collection). If a PyTorch release changes that, exit_rank's docstring and
    # notebook 09's explanation need another look.
    result = run_torchrun("multigpu.workers", 2, "ddp-exit", timeout=120.0)
    line = next(x for x in result.stdout.splitlines() if "native threads" in x)
    before, during, after = (int(word) for word in line.split() if word.isdigit())
    assert during > before
    assert after == during


@needs_proc
def test_without_ddp_destroy_process_group_ends_the_gloo_threads():
    script = (
        "import torch, torch.distributed as dist\n"
        "from multigpu.workers import native_threads as count\n"
        "torch.ones(2).sum(); before = count()\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, "
        "world_size=1)\n"
        "t = torch.ones(2); dist.all_reduce(t); during = count()\n"
        "dist.destroy_process_group(); print(before, during, count())\n"
    )
    done = _run_python(script)
    before, during, after = map(int, done.stdout.split())
    assert during > before
    assert after == before


def test_exit_rank_flushes_the_output_and_keeps_the_exit_status():
    script = (
        "import sys\n"
        "from multigpu.runtime.launch import exit_rank\n"
        "print('to stdout', end='')\n"
        "print('to stderr', end='', file=sys.stderr)\n"
        "exit_rank(3)\n"
    )
    done = _run_python(script)
    assert (done.returncode, done.stdout, done.stderr) == (3, "to stdout", "to stderr")


def test_ranks_ending_with_exit_rank_never_abort(no_leftovers):
    # Without exit_rank, 4 such ranks aborted in 1 launch of 30 and 1 of 40 on a
    # 2-core machine (bench/exit_abort.py): too rare to show in a test. With it, no
    # launch may fail.
    for _ in range(5):
        result = run_torchrun(
            "multigpu.workers", 4, "ddp-exit", "exit_rank", timeout=120.0, check=False
        )
        output = result.stdout + result.stderr
        assert "terminate called" not in output
        assert result.returncode == 0, output[-2000:]
        assert "after destroy_process_group" in result.stdout


def test_run_torchrun_stops_a_run_that_takes_too_long():
    before = _descendants()
    with pytest.raises(TorchrunError, match="did not finish within 0.5 s"):
        run_torchrun("multigpu.workers", 1, timeout=0.5)
    assert _descendants() - before == set()


def test_the_training_launches_of_notebook_08_carry_a_deadline(monkeypatch):
    from multigpu import allreduce_sgd
    from multigpu.core.models import ConvNet
    from multigpu.core.train import TrainConfig

    calls = []

    def fake_spawn(worker, world_size, *args, **options):
        calls.append(options)
        return [{"run": f"rank {rank}"} for rank in range(world_size)]

    monkeypatch.setattr(allreduce_sgd, "spawn", fake_spawn)
    X, y, config = torch.zeros(8, 1, 8, 8), torch.zeros(8), TrainConfig(batch_size=4)
    runs = allreduce_sgd.train_data_parallel(ConvNet(), X, y, config, 2)
    assert runs == ["rank 0", "rank 1"]
    allreduce_sgd.train_data_parallel(ConvNet(), X, y, config, 2, 5.0, "gloo", 60.0)
    allreduce_sgd.compare_data_parallel(
        ConvNet(), X, y, {"run": config}, 2, timeout=None, deadline=None
    )
    assert [(call["timeout"], call["deadline"]) for call in calls] == [
        (30.0, launch.DEFAULT_DEADLINE_S),
        (5.0, 60.0),
        (None, None),
    ]


def test_a_worker_module_written_at_run_time_into_a_folder_on_sys_path(
    tmp_path, monkeypatch
):
    # What a learner does from a notebook: %%writefile a module into a folder,
    # put the folder on sys.path, import the worker, launch it.
    (tmp_path / "learners_worker.py").write_text(
        "import torch\n"
        "import torch.distributed as dist\n\n\n"
        "def total(rank, world_size):\n"
        "    value = torch.tensor([rank + 1.0])\n"
        "    dist.all_reduce(value)\n"
        "    return value.item()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import learners_worker

    try:
        assert launch.spawn(learners_worker.total, 3, backend="gloo") == [6.0] * 3
    finally:
        sys.modules.pop("learners_worker", None)


def test_laptop_environment_sets_only_what_the_platform_needs_and_the_user_left_unset():
    base = {"PATH": "/usr/bin"}
    laptop = launch._laptop_environment
    assert laptop(base, "darwin") == {**base, "GLOO_SOCKET_IFNAME": "lo0"}
    assert laptop(base, "darwin", torchrun=True) == {
        **base,
        "GLOO_SOCKET_IFNAME": "lo0",
    }
    assert laptop(base, "win32") == base  # spawn: USE_LIBUV is torchrun's
    assert laptop(base, "win32", torchrun=True) == {**base, "USE_LIBUV": "0"}
    assert laptop(base, "linux") == base
    assert laptop(base, "linux", torchrun=True) == base
    # A value the user set is kept.
    mine = {**base, "GLOO_SOCKET_IFNAME": "en0", "USE_LIBUV": "1"}
    assert laptop(mine, "darwin", torchrun=True) == mine
    assert laptop(mine, "win32", torchrun=True) == mine
    # A copy: the caller's mapping (os.environ) is not changed.
    laptop(base, "darwin", torchrun=True)
    assert base == {"PATH": "/usr/bin"}
