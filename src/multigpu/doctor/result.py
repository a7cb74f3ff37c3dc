"""What one check of the doctor found, and how a list of them is printed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"
UNICODE_MARKS = {OK: "✓", WARN: "!", FAIL: "✗"}
ASCII_MARKS = {OK: "OK", WARN: "!!", FAIL: "XX"}


@dataclass(frozen=True)
class CheckResult:
    """One line of the doctor: ``name`` (what was checked), ``status`` (OK, WARN or
    FAIL), ``measured`` (what was found, with numbers) and ``fix`` (for WARN and
    FAIL: the one thing to do; "" for OK)."""

    name: str
    status: str
    measured: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in (OK, WARN, FAIL):
            raise ValueError(f"status must be ok, warn or fail, not {self.status!r}")
        if self.status != OK and not self.fix:
            raise ValueError(f"{self.name}: a {self.status} needs a fix text")

    def as_dict(self) -> dict[str, str]:
        """The result as plain data (``--json``)."""
        return asdict(self)


def ok(name: str, measured: str) -> CheckResult:
    """A check that passed."""
    return CheckResult(name, OK, measured)


def warn(name: str, measured: str, fix: str) -> CheckResult:
    """Something the course survives (slower, or outside the notebooks), with the
    advice that removes it."""
    return CheckResult(name, WARN, measured, fix)


def fail(name: str, measured: str, fix: str) -> CheckResult:
    """Something the notebooks need that is missing or broken, with its fix."""
    return CheckResult(name, FAIL, measured, fix)


def marks_for(encoding: str | None) -> dict[str, str]:
    """✓ and ✗ where ``encoding`` (a stream's) can write them, else plain ASCII."""
    try:
        "".join(UNICODE_MARKS.values()).encode(encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_MARKS
    return UNICODE_MARKS


def printable(text: str, marks: dict[str, str]) -> str:
    """``text`` with ``?`` for what an ASCII stream cannot write (a GPU's or a
    folder's name), where ``marks`` are the ASCII ones."""
    if marks is ASCII_MARKS:
        return text.encode("ascii", "replace").decode("ascii")
    return text


def format_result(result: CheckResult, marks: dict[str, str]) -> str:
    """``✓ name  measured``, and for a warning or failure a second line with the fix."""
    line = f"{marks[result.status]:2} {result.name:<16} {result.measured}"
    if result.fix:
        line += f"\n   {'fix' if result.status == FAIL else 'tip'}: {result.fix}"
    return printable(line, marks)


def count_text(results: Sequence[CheckResult], marks: dict[str, str]) -> str:
    """``11 ✓ 0 ✗ 1 warning``: how many checks passed, failed and warned."""
    counts = {status: sum(r.status == status for r in results) for status in marks}
    warnings = "warning" if counts[WARN] == 1 else "warnings"
    return (
        f"{counts[OK]} {marks[OK]} {counts[FAIL]} {marks[FAIL]} "
        f"{counts[WARN]} {warnings}"
    )


def summary_line(
    results: Sequence[CheckResult], machine: Sequence[str], marks: dict[str, str]
) -> str:
    """The one line to paste into a chat: the counts, then what the machine is
    (``machine``: "Linux x86_64", "Python 3.11.7", ...), joined by ``|``."""
    line = " | ".join([f"multigpu doctor: {count_text(results, marks)}", *machine])
    return printable(line, marks)
