"""One check's result, its line, and the summary line."""

import pytest

from multigpu.doctor.result import (
    ASCII_MARKS,
    FAIL,
    OK,
    UNICODE_MARKS,
    CheckResult,
    fail,
    format_result,
    marks_for,
    ok,
    summary_line,
    warn,
)


def test_marks_fall_back_to_ascii_where_the_stream_cannot_write_them():
    assert marks_for("utf-8") == UNICODE_MARKS
    assert marks_for("ascii") == ASCII_MARKS
    assert marks_for("cp1252") == ASCII_MARKS  # a Windows console: no ✓ or ✗
    assert marks_for(None) == ASCII_MARKS


def test_a_failure_prints_its_fix_under_it():
    line = format_result(fail("ports", "none free", "open one"), UNICODE_MARKS)
    assert line.splitlines() == [
        "✗  ports            none free",
        "   fix: open one",
    ]
    tip = format_result(warn("cores", "2 cores", "wait"), ASCII_MARKS)
    assert tip.splitlines()[1] == "   tip: wait"
    assert format_result(ok("disk", "9 GiB"), ASCII_MARKS) == (
        "OK disk             9 GiB"
    )


def test_a_warning_or_failure_without_a_fix_is_refused():
    with pytest.raises(ValueError, match="a fail needs a fix text"):
        CheckResult("disk", FAIL, "full")
    with pytest.raises(ValueError, match="status must be ok, warn or fail"):
        CheckResult("disk", "maybe", "full", "x")
    assert CheckResult("disk", OK, "fine").as_dict() == {
        "name": "disk",
        "status": "ok",
        "measured": "fine",
        "fix": "",
    }


def test_the_summary_counts_each_status():
    results = [ok("a", "x"), ok("b", "x"), warn("c", "x", "y"), fail("d", "x", "y")]
    machine = ["Linux x86_64", "Python 3.11.7"]
    assert summary_line(results, machine, UNICODE_MARKS) == (
        "multigpu doctor: 2 ✓ 1 ✗ 1 warning | Linux x86_64 | Python 3.11.7"
    )
    assert summary_line(results[:2], [], ASCII_MARKS) == (
        "multigpu doctor: 2 OK 0 XX 0 warnings"
    )


def test_ascii_output_replaces_what_ascii_cannot_write():
    result = warn("GPUs", "1 CUDA GPU (Ünïcode Card)", "hide it")
    assert format_result(result, ASCII_MARKS).splitlines()[0] == (
        "!! GPUs             1 CUDA GPU (?n?code Card)"
    )
    assert summary_line([result], ["Café"], ASCII_MARKS).endswith("| Caf?")
    assert "Ünïcode" in format_result(result, UNICODE_MARKS)
