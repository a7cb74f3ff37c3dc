"""Tests for the errors spawn raises (multigpu.runtime.launch._diagnosis): the rank
that explains a failure, deadlines, messages for each way a rank can fail."""

import signal
import subprocess
import sys
import time

import pytest

from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime import launch
from multigpu.runtime.launch import (
    DeadlineExceededError,
    WorkerError,
    parent,
    spawn,
)
from tests import ranks as test_ranks
from tests.runtime.launch.processes import SLACK, TIMEOUT


def test_a_rank_that_raises_is_named_with_its_traceback(no_leftovers):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        spawn(collective_ranks.fail_on_rank, 3, 1, timeout=TIMEOUT)
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
        spawn(collective_ranks.kill_rank, 3, 2, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT
    error = caught.value
    assert str(error) == "Rank 2 of 3 was killed by SIGKILL without reporting an error"
    assert (error.rank, error.exitcode) == (2, -9)
    assert not error.timed_out


def test_a_rank_that_never_joins_times_out_instead_of_hanging(no_leftovers):
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        spawn(collective_ranks.skip_collective_rank, 2, 1, 300.0, timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    assert TIMEOUT <= elapsed < TIMEOUT + SLACK
    error = caught.value
    assert error.rank == 0
    assert error.timed_out
    assert error.missing_ranks == [1]
    assert "Rank(s) [1] had not reported" in str(error)


# Long enough for ranks 0 and 2 to join the group and return on a loaded 2-core
# machine (at 2 s, a `make test` once found rank 0 or 2 not yet returned); rank 1
# sleeps until then, so the wait costs no processor time.
STUCK_DEADLINE_S = 6.0


def test_a_rank_stuck_outside_collectives_is_stopped_at_the_deadline(no_leftovers):
    start = time.monotonic()
    with pytest.raises(DeadlineExceededError) as caught:
        spawn(
            collective_ranks.stuck_outside_collectives_rank,
            3,
            1,
            timeout=TIMEOUT,
            deadline=STUCK_DEADLINE_S,
        )
    elapsed = time.monotonic() - start
    assert STUCK_DEADLINE_S <= elapsed < STUCK_DEADLINE_S + SLACK
    error = caught.value
    assert isinstance(error, WorkerError)
    assert str(error) == (
        f"The launch did not finish within its deadline of {STUCK_DEADLINE_S:g} s: "
        "rank 1 of 3 still running (ranks 0 and 2 had returned). Every rank has been "
        "stopped. A rank stuck outside any collective (an endless loop, a blocking "
        "read) is caught by the deadline, not by the timeout: error.traceback shows "
        "where rank 1 was. If the work just needs longer, pass a larger deadline= "
        "(None for no deadline)."
    )
    assert (error.rank, error.exitcode, error.deadline) == (1, None, STUCK_DEADLINE_S)
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
    monkeypatch.setattr(parent, "time", fast_clock)
    with pytest.raises(DeadlineExceededError) as caught:
        spawn(
            collective_ranks.skip_collective_rank, 1, 0, 5.0
        )  # rank 0 sleeps 5 s, then returns
    assert real() - started < 5.0  # stopped before the rank could return
    error = caught.value
    assert error.deadline == launch.DEFAULT_DEADLINE_S
    assert str(error).startswith(
        f"The launch did not finish within its deadline of "
        f"{launch.DEFAULT_DEADLINE_S:g} s: rank 0 of 1 still running."
    )
    assert error.missing_ranks == [0]


def test_a_result_that_cannot_be_unpickled_here_is_attributed_to_its_rank(
    no_leftovers,
):
    with pytest.raises(WorkerError) as caught:
        spawn(test_ranks.result_that_fails_to_unpickle_rank, 2, 1, timeout=TIMEOUT)
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
        spawn(collective_ranks.skip_collective_rank, 2, 1, 0.0, timeout=TIMEOUT)
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
        spawn(test_ranks.mismatched_shapes_rank, 2, timeout=TIMEOUT)
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
        spawn(test_ranks.exit_without_returning_rank, 2, 1, timeout=TIMEOUT)
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
        spawn(test_ranks.raise_unprintable_rank, 2, 1, timeout=TIMEOUT)
    error = caught.value
    assert str(error) == (
        "Rank 1 of 2 failed with UnprintableError, whose message cannot be shown: "
        "str() of it raised RuntimeError: this exception cannot be turned into text"
    )
    assert (error.rank, error.exitcode) == (1, None)
    assert "raise UnprintableError()" in error.traceback


def test_the_main_guard_hint_is_kept_for_a_rank_that_died_before_its_worker(tmp_path):
    # A script without `if __name__ == "__main__":` under the "spawn" start method:
    # each new process runs the script again, and its own call to spawn kills it
    # before it can report. (Once the worker has started, the hint is left out: see
    # test_a_worker_that_calls_os_exit_gets_its_own_message.)
    script = tmp_path / "no_main_guard.py"
    script.write_text(
        "from multigpu.ranks.collectives import whoami_rank\n"
        "from multigpu.runtime.launch import WorkerError, parent, spawn\n"
        "parent.START_METHOD = 'spawn'\n"
        "try:\n"
        "    spawn(whoami_rank, 1, timeout=60.0)\n"
        "except WorkerError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.startswith(
        "Rank 0 of 1 exited with code 1 before it could report (see its stderr; a "
        "script that calls spawn needs an `if __name__ == '__main__':` guard)"
    ), done.stdout + done.stderr
