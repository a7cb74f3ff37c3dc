"""A communication stream on CPU: one thread that runs collectives in order (14).

On a GPU, FSDP issues its all-gathers and reduce-scatters on a second CUDA stream,
so they run while the compute stream works. Here the stand-in is one worker thread:
:meth:`CommStream.submit` queues a collective and returns at once with a
:class:`Handle`; the thread runs the queued collectives one after another, in the
order they were submitted (the same order on every rank, so the ring's messages
match), while the main thread computes. torch's matrix products and gloo's waits
release the GIL, so both really run at the same time. With ``record=True`` every
collective becomes a span on the timeline (:class:`~multigpu.miniddp.TimelineEvent`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from multigpu.miniddp.timeline import TimelineEvent


class Handle:
    """A queued collective: :meth:`wait` blocks until it has run and returns its
    result (14)."""

    def __init__(self, future: Future | None = None, result: object = None) -> None:
        self.future = future
        self.result = result

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def wait(self) -> object:
        if self.future is not None:
            self.result = self.future.result()  # re-raises the thread's error
            self.future = None
        return self.result


class CommStream:
    """One thread that runs submitted collectives in submission order (14)."""

    def __init__(self, record: bool = False) -> None:
        self.record = record
        self.events: list[TimelineEvent] = []
        self.t0 = time.perf_counter()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="comm")
        self.pending: list[Handle] = []
        self.failed: BaseException | None = None  # the first collective that failed

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def submit(self, lane: str, name: str, work: Callable[[], object]) -> Handle:
        """Queue ``work()`` (a collective) and return its handle without waiting.
        Once one has failed, the later ones raise its error without running."""

        def run() -> object:
            if self.failed is not None:  # the ranks' collectives no longer pair up
                raise self.failed
            start = self.now()
            try:
                result = work()
            except BaseException as error:
                self.failed = error  # every later collective fails the same way
                raise
            if self.record:
                self.events.append(TimelineEvent(lane, name, start, self.now()))
            return result

        handle = Handle(self.pool.submit(run))
        self.pending.append(handle)
        return handle

    def synchronize(self) -> None:
        """Wait for everything submitted so far."""
        for handle in self.pending:
            handle.wait()
        self.pending = []

    def close(self) -> None:
        self.synchronize()
        self.pool.shutdown(wait=True)
