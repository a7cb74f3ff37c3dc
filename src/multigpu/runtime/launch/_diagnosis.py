"""From what the parent of spawn saw to one error: the failure that explains the
others, or the ranks still running at the deadline."""

from __future__ import annotations

import os
import re
import signal
import time
import traceback
from collections.abc import Iterable
from multiprocessing.connection import wait

from multigpu.runtime.launch._child import describe_exception
from multigpu.runtime.launch._stderr import StderrTails
from multigpu.runtime.launch.errors import (
    DeadlineExceededError,
    RemoteTraceback,
    WorkerError,
)

_STDERR_LINES_SHOWN = 5  # lines of a dead rank's stderr quoted in its error message
_STACK_WAIT_S = 1.0  # at the deadline, how long to wait for a stuck rank's stack


def _ranks_text(ranks: Iterable[int]) -> str:
    """How a message names ranks: "rank 2", "ranks 0 and 2", "ranks 0, 1 and 3"."""
    numbers_ = [str(rank) for rank in sorted(ranks)]
    if len(numbers_) == 1:
        return f"rank {numbers_[0]}"
    return f"ranks {', '.join(numbers_[:-1])} and {numbers_[-1]}"


def _last_lines(text: str, count: int = _STDERR_LINES_SHOWN) -> list[str]:
    """The last ``count`` lines of ``text`` that say something: no blank lines and
    no C++ stack frames ("frame #3: ...")."""
    lines = [
        line.rstrip()
        for line in text.replace("\r", "\n").splitlines()
        if line.strip()
        and not line.lstrip().startswith(("frame #", "<omitting python frames>"))
    ]
    return [line[:500] for line in lines[-count:]]


# gloo's words when the rank at the other end of a connection has ended.
_PEER_CLOSED = re.compile(r"Connection (closed|reset) by peer")


class Failure:
    """What the parent learnt about one failed rank."""

    def __init__(
        self,
        rank: int,
        exitcode: int | None,
        report: dict | None = None,
        started: bool = False,
        unpickle_error: Exception | None = None,
    ):
        self.rank = rank
        self.exitcode = exitcode
        self.report = report  # from _error_report, None if the rank died
        self.started = started  # its worker had started
        self.unpickle_error = unpickle_error  # its result could not be unpickled
        self.stderr = ""  # the end of its stderr, filled in by failure_error

    @property
    def priority(self) -> int:
        """0: the worker's own exception, 1: died, 2: a communication error (a
        timeout, say), 3: a connection the peer closed (always another rank's end)."""
        if self.unpickle_error is not None:
            return 0
        if self.report is None:
            return 1
        if not self.report["communication"]:
            return 0
        return 3 if _PEER_CLOSED.search(self.report["message"] or "") else 2

    def describe(self, world_size: int) -> tuple[str, str]:
        """The headline and the traceback text of this failure."""
        who = f"Rank {self.rank} of {world_size}"
        if self.unpickle_error is not None:
            headline = (
                f"{who} returned a value that cannot be unpickled in this process "
                f"({describe_exception(self.unpickle_error)}). Return tensors, "
                "numbers, strings, lists or dicts, or objects of classes that this "
                "process can import and rebuild."
            )
            tb = "".join(traceback.format_exception(self.unpickle_error))
            return headline, f"{headline}\n\nWhile unpickling it here:\n{tb}"
        if self.report is not None:
            name, message = self.report["name"], self.report["message"]
            if message is None:
                headline = (
                    f"{who} failed with {name}, whose message cannot be shown: "
                    f"str() of it raised {self.report['unprintable']}"
                )
            else:
                headline = f"{who} failed with {name}: {message}"
            return headline, self.report["traceback"]
        code = self.exitcode
        if code is not None and code < 0:
            how = f"was killed by {_signal_name(-code)} without reporting an error"
        elif self.started:
            how = (
                f"exited with code {code} while its worker was running, without "
                "returning or raising: the worker, or something it called, ended "
                f"the process (for example with os._exit({code})). A worker must "
                "return its result or raise an exception"
            )
        else:
            how = (
                f"exited with code {code} before it could report (see its stderr; a "
                "script that calls spawn needs an `if __name__ == '__main__':` guard)"
            )
        headline = f"{who} {how}"
        tb = f"{headline} (no Python traceback: the process died).\n"
        lines = _last_lines(self.stderr)
        if lines:
            quoted = "\n".join(f"    {line}" for line in lines)
            headline += f". Its stderr ends with:\n{quoted}"
            tb += f"Its stderr ends with:\n{self.stderr}"
        return headline, tb


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_error(
    failures: list[Failure],
    silent: set[int],
    returned: set[int],
    world_size: int,
    stderr: StderrTails,
    waited_long_enough: bool = False,
) -> WorkerError:
    """One WorkerError for the most telling failure; mention the others briefly.

    It timed out if the rank said so (see :func:`is_timeout`), or if it failed in
    torch.distributed after ``timeout`` seconds while other ranks were still running
    without a word: it was waiting for them. If it failed in torch.distributed after
    a peer's worker had returned normally, the ranks called different collectives.
    """
    for failure in failures:
        failure.stderr = stderr.text(failure.rank)
    first = min(failures, key=lambda f: (f.priority, f.rank))
    timed_out = first.priority >= 2 and (
        bool(first.report["timed_out"]) or (bool(silent) and waited_long_enough)
    )
    headline, tb = first.describe(world_size)
    message = headline
    peers_returned = returned - {first.rank}
    if first.priority >= 2 and peers_returned:
        message = (
            f"Rank {first.rank} of {world_size} was still in a collective when "
            f"{_ranks_text(peers_returned)} returned normally from the worker: the "
            "ranks called different collectives (a collective mismatch). Every rank "
            "must call the same collectives in the same order; look for one that "
            "only some ranks reach (a branch on the rank, an early return, a loop "
            "whose length differs). torch.distributed's own error is in "
            "error.traceback"
        )
    elif first.priority >= 2 and silent:
        message += (
            f". Rank(s) {sorted(silent)} had not reported: a rank that never joins "
            "a collective makes the others time out"
        )
    error = WorkerError(
        message,
        first.rank,
        first.exitcode,
        tb,
        timed_out,
        missing_ranks=silent,
        returned_ranks=returned,
        stderr=first.stderr,
    )
    # Everything seen, for the curious; left out of the message to keep it stable.
    error.failures = [failure.describe(world_size)[0] for failure in failures]
    error.__cause__ = RemoteTraceback(tb)
    return error


def deadline_error(
    processes: list,
    running: set[int],
    returned: set[int],
    stderr: StderrTails,
    deadline: float,
) -> DeadlineExceededError:
    """The error for ranks still running at the deadline, with the Python stack of
    the first of them: asked for with SIGUSR1 (see run_rank), read from its
    stderr. The caller's ``finally`` then stops them."""
    first = min(running)
    stderr.forward = False  # the stacks are for the error, not for the screen
    stderr.pump()
    before = stderr.received(first)
    stack = ""
    if hasattr(signal, "SIGUSR1"):
        for rank in running:
            try:
                os.kill(processes[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        give_up = time.monotonic() + _STACK_WAIT_S
        quiet_since = None
        while time.monotonic() < give_up:
            wait(stderr.waitables(), timeout=0.05)
            if stderr.pump():
                quiet_since = time.monotonic()
            elif quiet_since is not None and time.monotonic() - quiet_since > 0.1:
                break  # the dump has arrived, and nothing more comes
        stack = stderr.text(first, since=before)
    world_size = len(processes)
    message = (
        f"The launch did not finish within its deadline of {deadline:g} s: "
        f"{_ranks_text(running)} of {world_size} still running"
    )
    if returned:
        message += f" ({_ranks_text(returned)} had returned)"
    message += (
        ". Every rank has been stopped. A rank stuck outside any collective (an "
        "endless loop, a blocking read) is caught by the deadline, not by the "
        "timeout: "
        f"error.traceback shows where rank {first} was. If the work just needs "
        "longer, pass a larger deadline= (None for no deadline)."
    )
    if stack.strip():
        tb = f"Rank {first} at the deadline (stack dumped by faulthandler):\n{stack}"
    else:
        tb = f"Rank {first} was still running at the deadline (no stack available).\n"
    error = DeadlineExceededError(
        message,
        first,
        tb,
        deadline,
        missing_ranks=running,
        returned_ranks=returned,
        stderr=stderr.text(first),
    )
    error.__cause__ = RemoteTraceback(tb)
    return error


def start_deadline_error(
    started: int, world_size: int, deadline: float, why: str = ""
) -> DeadlineExceededError:
    """The error for a deadline that passed while spawn was still starting ranks
    (``started`` of ``world_size`` had started; ``why``: what is known of the cause,
    from _start); the caller then stops them. No rank had reported anything: all
    are missing, and ``rank`` is 0."""
    message = (
        f"The launch did not finish within its deadline of {deadline:g} s: it had "
        f"started only {started} of {world_size} ranks"
    )
    if why:
        message += f" ({why}). Every rank has been stopped. Run the launch again."
    else:
        message += (
            ". Every rank has been stopped. Starting ranks takes time on a busy "
            "machine: use fewer ranks, or pass a larger deadline= (None for no "
            "deadline)."
        )
    tb = f"The deadline passed before rank {started} was started.\n"
    error = DeadlineExceededError(
        message, 0, tb, deadline, missing_ranks=range(world_size)
    )
    error.__cause__ = RemoteTraceback(tb)
    return error
