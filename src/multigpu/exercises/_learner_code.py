"""What the checkers that start ranks share: refusing learner code the ranks cannot
import, telling ranks stuck in a collective from a learner's exception, and the last
line of a rank's error."""

from __future__ import annotations

from multigpu.runtime.launch import (
    WorkerError,
    WorkerNotImportableError,
    check_importable,
)


def importable_or_raise(function: object, what: str, passed: str = "function") -> None:
    """Raise WorkerNotImportableError, saying how to fix it, unless the ranks can
    import ``function`` (the learner's ``what``, passed as an imported ``passed``)."""
    name = getattr(function, "__qualname__", repr(function))
    try:
        check_importable(function)
    except (TypeError, WorkerNotImportableError):
        raise WorkerNotImportableError(
            f"The {what} {name!r} cannot be imported by the ranks. Write it in a "
            "module (in a notebook, a %%module cell), import it from there and pass "
            f"the imported {passed}."
        ) from None


def ranks_were_stuck(error: WorkerError) -> bool:
    """Whether the ranks stopped in a collective (a deadlock or a mismatch) rather
    than on an exception of the learner's code."""
    return error.timed_out or "collective mismatch" in str(error)


def last_line(error: WorkerError) -> str:
    """The last line of a rank's traceback (the error itself)."""
    return (error.traceback.strip().splitlines() or [str(error)])[-1]
