"""Tests for the child side of spawn (multigpu.runtime.launch._child): what a rank
started ends with it, its result is checked, and the ranks end when the caller of
spawn dies, even by SIGKILL, even when no Python can run in them."""

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from multigpu.runtime.launch import (
    WorkerError,
    spawn,
)
from tests import ranks as test_ranks
from tests.runtime.launch.processes import TIMEOUT, gone


def test_processes_a_rank_started_are_ended_too(tmp_path, no_leftovers):
    pid_file = tmp_path / "sleeper"
    with pytest.raises(WorkerError, match="after starting a subprocess"):
        spawn(
            test_ranks.start_sleeper_then_fail_rank, 2, str(pid_file), timeout=TIMEOUT
        )
    pids = [int((tmp_path / f"sleeper.{rank}").read_text()) for rank in range(2)]
    assert all(gone(pid) for pid in pids)


def test_a_result_that_cannot_be_pickled_is_reported(no_leftovers):
    with pytest.raises(WorkerError, match=r"TypeError: Rank \d returned a generator"):
        spawn(test_ranks.unpicklable_result_rank, 2, timeout=TIMEOUT)


ROOT = Path(__file__).resolve().parents[3]


# The caller died: its last rank must be gone this soon. Quiet, 0.05-0.1 s; beside
# `make test`'s nine parts on 2 cores the watchdog took 2.04 s once to be scheduled
# and kill a rank that held the GIL.
ORPHAN_LIMIT_S = 10.0
# ... and the forkserver and resource tracker this soon. They end as soon as their
# pipe closes, but each is a Python that imported torch and its exit takes about 1 s
# of a quiet core; with `make test`'s parts on 2 cores it took 5.1 s once.
HELPER_LIMIT_S = 15.0


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


@pytest.mark.parametrize("ranks", ["HOLDING_THE_GIL", "STOPPED"])
def test_ranks_end_when_the_caller_is_killed_while_no_python_runs_in_them(
    ranks, tmp_path
):
    # The lifeline thread cannot run in a rank stopped by SIGSTOP, or in one C call
    # that holds the GIL (a regular expression that backtracks for years).
    orphans = _orphans()
    state = getattr(orphans, ranks)
    _check_no_orphans(orphans.kill_a_script(signal.SIGKILL, tmp_path, ranks=state))
