"""Tests for multigpu.runtime.launch.parent: spawn's results, its checks of its
arguments, its warnings, launches at once."""

import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from multigpu.core.sizes import GiB, MiB
from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime import launch
from multigpu.runtime.launch import (
    DeadlineExceededError,
    parent,
    run_torchrun,
    spawn,
)
from tests import ranks as test_ranks
from tests.runtime.launch.processes import TIMEOUT, descendants


def test_results_come_back_ordered_by_rank_with_limited_threads(no_leftovers):
    rows = spawn(collective_ranks.whoami_rank, 3, timeout=TIMEOUT, threads=1)
    assert [row["rank"] for row in rows] == [0, 1, 2]
    assert [row["dist_rank"] for row in rows] == [0, 1, 2]
    assert {row["world_size"] for row in rows} == {3}
    assert {row["backend"] for row in rows} == {"gloo"}
    assert {row["threads"] for row in rows} == {1}
    assert {row["OMP_NUM_THREADS"] for row in rows} == {"1"}


@pytest.mark.skipif(
    parent.START_METHOD != "forkserver", reason="only a forkserver preloads modules"
)
def test_a_rank_imports_nothing_to_take_a_training_step():
    # torch.optim.Optimizer.__init__ imports torch._dynamo (about 1 CPU-second) on
    # its first call; the forkserver imports it once, so no rank pays it again.
    assert spawn(test_ranks.modules_a_training_step_imports_rank, 2) == [[], []]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives_work_inside_the_workers(world_size):
    expected = world_size * (world_size + 1) // 2
    assert (
        spawn(collective_ranks.sum_of_ranks_rank, world_size) == [expected] * world_size
    )


def test_arguments_reach_every_rank_and_threads_are_configurable():
    assert spawn(collective_ranks.sum_of_ranks_rank, 2, 10, threads=2) == [21, 21]
    rows = spawn(collective_ranks.whoami_rank, 2, threads=2)
    assert {(row["threads"], row["OMP_NUM_THREADS"]) for row in rows} == {(2, "2")}


def test_the_caller_environment_reaches_the_workers(monkeypatch):
    monkeypatch.setenv("MULTIGPU_TEST_FLAG", "set-after-the-forkserver")
    assert spawn(test_ranks.environment_value_rank, 1, "MULTIGPU_TEST_FLAG") == [
        "set-after-the-forkserver"
    ]


def test_no_rank_goes_on_from_a_group_before_every_rank_has_made_it():
    """Rank 2, not in the group of ranks 0 and 1, makes it 2 s late: ranks 0 and 1
    wait for it, so a worker that makes its groups and returns cannot close its
    connections while a peer is still making one (without the wait they returned
    at once, and a peer once failed in a lesson's launch)."""
    times = spawn(test_ranks.group_made_while_a_rank_sleeps_rank, 3, 2, 2.0)
    late_call = times[2][0]
    assert times[0][0] < late_call - 0.5 and times[1][0] < late_call - 0.5
    assert times[0][1] >= late_call and times[1][1] >= late_call


def test_the_spawn_start_method_works_too(monkeypatch):
    monkeypatch.setattr(parent, "START_METHOD", "spawn")
    rows = spawn(collective_ranks.whoami_rank, 2, timeout=30.0)
    assert [(row["rank"], row["threads"]) for row in rows] == [(0, 1), (1, 1)]


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError) as caught:
        spawn(collective_ranks.whoami_rank, 0)
    assert str(caught.value) == (
        "world_size must be an integer of at least 1, got 0. Ask for as many "
        "processes as you want ranks."
    )
    with pytest.raises(ValueError, match="world_size must be an integer"):
        spawn(collective_ranks.whoami_rank, 2.0)
    with pytest.raises(ValueError) as caught:
        spawn(collective_ranks.whoami_rank, 1, threads=0)
    assert str(caught.value) == (
        "threads must be an integer of at least 1, got 0. Pass how many CPU "
        "threads each rank may use, e.g. threads=1."
    )
    with pytest.raises(ValueError, match="threads must be an integer"):
        run_torchrun("multigpu.ranks.torchrun_example", 1, threads=True)
    with pytest.raises(ValueError, match="timeout"):
        spawn(collective_ranks.whoami_rank, 1, timeout=0)
    with pytest.raises(ValueError, match="Unknown backend"):
        spawn(collective_ranks.whoami_rank, 1, backend="mpi")
    with pytest.raises(TypeError, match="cannot be pickled"):
        spawn(collective_ranks.sum_of_ranks_rank, 1, (i for i in range(3)))


def test_an_infinite_timeout_or_deadline_is_refused_with_the_way_to_say_none():
    with pytest.raises(ValueError) as caught:
        spawn(collective_ranks.whoami_rank, 1, timeout=float("inf"))
    assert str(caught.value) == (
        "timeout=inf cannot be used: torch.distributed and the launcher need a "
        "finite number of seconds. For no timeout, pass timeout=None."
    )
    with pytest.raises(ValueError, match="For no deadline, pass deadline=None"):
        spawn(collective_ranks.whoami_rank, 1, deadline=float("inf"))
    with pytest.raises(ValueError, match="deadline must be a positive number"):
        spawn(collective_ranks.whoami_rank, 1, deadline=0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        spawn(collective_ranks.whoami_rank, 1, timeout=float("nan"))
    with pytest.raises(TypeError, match="deadline must be a number of seconds"):
        spawn(collective_ranks.whoami_rank, 1, deadline="60")


@pytest.mark.parametrize(
    "options",
    [{"timeout": 1e300}, {"timeout": 1e14}, {"timeout": 1e-3}, {"threads": 10**6}],
    ids=["timeout=1e300", "timeout=1e14", "timeout=1e-3", "threads=10**6"],
)
def test_sizes_out_of_range_are_refused_by_name_before_any_process_starts(options):
    # They used to give a raw OverflowError, torch's DistNetworkError, or a machine
    # out of threads and a rank that "never joins".
    ((name, value),) = options.items()
    allowed = {
        "timeout": f"from {launch.MIN_TIMEOUT_S:g} to {launch.MAX_TIMEOUT_S:.0f} "
        "seconds",
        "threads": f"an integer from 1 to {launch.MAX_THREADS}",
    }[name]
    before = descendants()
    with pytest.raises(ValueError) as caught:
        spawn(collective_ranks.whoami_rank, 2, **options)
    assert descendants() - before == set()
    message = str(caught.value)
    assert message.startswith(f"{name} must be {allowed}")
    assert f"got {value!r}" in message
    assert "\n" not in message


def test_the_size_limits_hold_every_value_the_lessons_pass():
    # src/ and notebooks/ pass timeouts from 2 s to 300 s, the tests 1 s; a year is
    # what timeout=None gives torch. Threads: 1, and 2 in the tests.
    assert launch.MIN_TIMEOUT_S <= 1.0
    assert launch.MAX_TIMEOUT_S == launch.NO_TIMEOUT.total_seconds()
    assert launch.MAX_THREADS >= max(os.cpu_count(), 8)
    # torch takes the longest timeout (the rendezvous and a collective).
    assert spawn(
        collective_ranks.sum_of_ranks_rank, 2, timeout=launch.MAX_TIMEOUT_S
    ) == [3, 3]
    with pytest.raises(ValueError, match="threads must be an integer from 1 to"):
        run_torchrun("multigpu.ranks.torchrun_example", 1, threads=10**6)


def test_far_more_ranks_than_cores_gives_a_warning(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # in this process, the parent
    with pytest.warns(RuntimeWarning) as caught:
        rows = spawn(collective_ranks.whoami_rank, 5)
    assert [row["rank"] for row in rows] == [0, 1, 2, 3, 4]
    (warning,) = [w for w in caught if "world_size=5" in str(w.message)]
    assert str(warning.message) == (
        "world_size=5 starts 5 processes on 1 CPU core(s), more than 4 per core: "
        "each rank gets a small slice of a core, so the launch may crawl and its "
        "collectives may reach their timeout. Use at most 4 ranks on this "
        "machine, or raise timeout= and deadline= if you mean it."
    )
    assert warning.filename == __file__  # it points at the line that called spawn
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        spawn(collective_ranks.whoami_rank, 4)  # 4 per core: no warning
    assert not [w for w in seen if "per core" in str(w.message)]


def test_more_ranks_than_the_machine_can_start_are_refused_before_any_starts(
    monkeypatch, no_leftovers
):
    monkeypatch.setattr(parent, "MAX_RANKS", 3)
    with pytest.raises(ValueError) as caught:
        spawn(collective_ranks.whoami_rank, 4)
    assert str(caught.value) == (
        "world_size=4 is more ranks than spawn starts on this machine: at most 3 "
        "(multigpu.runtime.launch.parent.MAX_RANKS: 32 per CPU core, one per 64 MiB "
        "of memory). Use fewer ranks, or raise MAX_RANKS if you mean it."
    )
    assert len(spawn(collective_ranks.whoami_rank, 3)) == 3


def test_a_billion_ranks_are_refused_at_once():
    # It used to fork until the memory ran out (the deadline bounds it if not).
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^world_size=1000000000 is more ranks than "):
        spawn(collective_ranks.whoami_rank, 10**9, deadline=2.0)
    assert time.monotonic() - started < 2.0


def test_the_limit_on_ranks_comes_from_the_cores_and_the_memory():
    assert parent.max_ranks(2, 64 * GiB) == 64  # 32 per core
    assert parent.max_ranks(16, 4 * GiB) == 64  # one per 64 MiB
    assert parent.max_ranks(3, None) == 96  # memory unknown
    assert parent.max_ranks(1, 10 * MiB) == 1  # one rank, always
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert parent.MAX_RANKS == parent.max_ranks(os.cpu_count(), memory)


def test_the_deadline_holds_from_the_first_fork(no_leftovers):
    # A deadline that has passed before the first rank starts: no rank starts.
    with pytest.raises(DeadlineExceededError) as caught:
        spawn(collective_ranks.whoami_rank, 4, deadline=1e-6)
    assert str(caught.value) == (
        "The launch did not finish within its deadline of 1e-06 s: it had started "
        "only 0 of 4 ranks. Every rank has been stopped. Starting ranks takes time "
        "on a busy machine: use fewer ranks, or pass a larger deadline= (None for "
        "no deadline)."
    )
    assert caught.value.missing_ranks == [0, 1, 2, 3]
    assert caught.value.timed_out


def test_nccl_with_more_ranks_than_gpus_is_refused():
    too_many = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match="one GPU per rank"):
        spawn(collective_ranks.whoami_rank, too_many, backend="nccl")


def test_auto_uses_gloo_when_there_are_fewer_gpus_than_ranks(monkeypatch):
    # A laptop with one GPU: nccl would need one GPU per rank, so the 2 ranks run on
    # gloo instead of being refused.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ranks = spawn(collective_ranks.whoami_rank, 2)
    assert [rank["backend"] for rank in ranks] == ["gloo", "gloo"]


def test_eight_launches_at_once_do_not_clash(no_leftovers):
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(
                spawn, collective_ranks.sum_of_ranks_rank, 2, offset, timeout=30.0
            )
            for offset in range(8)
        ]
        results = [future.result() for future in futures]
    assert results == [[2 * offset + 1] * 2 for offset in range(8)]


def test_the_training_launches_of_notebook_08_carry_a_deadline(monkeypatch):
    from multigpu.core.models import ConvNet
    from multigpu.core.train import TrainConfig
    from multigpu.ranks import allreduce_sgd

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
