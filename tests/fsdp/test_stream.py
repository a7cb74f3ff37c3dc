"""CommStream runs submitted work in order on one thread, returns results through
handles, records spans and passes errors on to the waiting thread."""

import threading

import pytest

from multigpu.fsdp import CommStream


def test_work_runs_in_submission_order_off_the_main_thread():
    stream = CommStream(record=True)
    seen = []
    handles = [
        stream.submit(
            "all-gather",
            f"unit {i}",
            lambda i=i: seen.append((i, threading.current_thread().name)) or i,
        )
        for i in range(3)
    ]
    assert [h.wait() for h in handles] == [0, 1, 2]
    stream.close()
    assert [i for i, _ in seen] == [0, 1, 2]
    assert all(name.startswith("comm") for _, name in seen)
    assert [e.name for e in stream.events] == ["unit 0", "unit 1", "unit 2"]
    assert all(e.lane == "all-gather" and e.end >= e.start for e in stream.events)


def test_an_error_in_the_thread_is_raised_by_wait():
    stream = CommStream()
    handle = stream.submit("reduce-scatter", "x", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        handle.wait()
    stream.pool.shutdown()


def test_after_a_failed_collective_the_later_ones_fail_alike_without_running():
    """Once the ranks' collectives no longer pair up, running the next one would
    wait forever: it raises the first error instead."""
    stream = CommStream()
    ran = []
    first = stream.submit("all-gather", "a", lambda: 1 / 0)
    later = stream.submit("all-gather", "b", lambda: ran.append("b"))
    with pytest.raises(ZeroDivisionError):
        first.wait()
    with pytest.raises(ZeroDivisionError):
        later.wait()
    assert ran == []
    stream.pool.shutdown()
