"""The errors of a launch: a rank that failed, a launch past its deadline, a worker
that new processes cannot import, a torchrun that failed (07-11)."""

from __future__ import annotations

from collections.abc import Iterable


class WorkerError(RuntimeError):
    """A rank raised or died: ``rank``, ``exitcode`` (None when it reported an
    exception), its ``traceback`` text, ``failures`` (every failure seen),
    ``timed_out`` (it gave up waiting for its peers, or the launch ran past its
    deadline), ``missing_ranks`` (ranks still silent when the error was raised,
    sorted), ``returned_ranks`` (ranks whose worker had returned, sorted) and
    ``stderr`` (the end of what the rank printed to stderr, often "") (07)."""

    def __init__(
        self,
        message: str,
        rank: int,
        exitcode: int | None,
        tb: str,
        timed_out: bool = False,
        missing_ranks: Iterable[int] = (),
        returned_ranks: Iterable[int] = (),
        stderr: str = "",
    ):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = tb
        self.failures: list[str] = []
        self.timed_out = timed_out
        self.missing_ranks = sorted(missing_ranks)
        self.returned_ranks = sorted(returned_ranks)
        self.stderr = stderr


class DeadlineExceededError(WorkerError):
    """The launch ran past its ``deadline`` (seconds) and was stopped (07).

    ``missing_ranks`` were still running; ``rank`` is the first of them and
    ``traceback`` its Python stack at the deadline, where it could be dumped.
    ``timed_out`` is True and ``exitcode`` None.
    """

    def __init__(
        self,
        message: str,
        rank: int,
        tb: str,
        deadline: float,
        missing_ranks: Iterable[int],
        returned_ranks: Iterable[int] = (),
        stderr: str = "",
    ):
        super().__init__(
            message,
            rank,
            None,
            tb,
            timed_out=True,
            missing_ranks=missing_ranks,
            returned_ranks=returned_ranks,
            stderr=stderr,
        )
        self.deadline = deadline


class WorkerNotImportableError(ValueError):
    """The worker cannot be imported by a fresh process (notebook, lambda, nested),
    or the script that called spawn cannot be read again (standard input)."""


class TorchrunError(RuntimeError):
    """A torchrun run failed or timed out; ``output`` holds what it printed."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


class RemoteTraceback(Exception):
    """Shows a child's traceback as the cause of a :class:`WorkerError`."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
