"""The whole doctor: its order, exit status, JSON, ASCII output, and the real run
from a shell."""

import io
import json
import os
import re
import subprocess
import sys
import time

from multigpu.doctor import report
from multigpu.doctor.environment import project_root
from multigpu.doctor.report import main, run_check, run_checks
from multigpu.doctor.result import (
    ASCII_MARKS,
    FAIL,
    UNICODE_MARKS,
    fail,
    ok,
    warn,
)

SUMMARY = re.compile(
    r"multigpu doctor: (\d+) (✓|OK) 0 (✗|XX) (\d+) warnings? \| \S+ \S+ \| "
    r"Python 3\.\d+\.\d+ \| torch \S+ \| \d+ cores? \| (no GPU|\d+ GPUs?)"
)


class Utf8Stream(io.StringIO):
    encoding = "utf-8"


def test_a_check_that_raises_becomes_a_failure_that_names_it():
    def check_disk():
        raise PermissionError("/home is not readable")

    result = run_check(check_disk)
    assert result.status == FAIL
    assert result.name == "disk"
    assert result.measured == (
        "the check itself raised PermissionError: /home is not readable"
    )
    assert result.fix == "paste this output to your instructor"


def test_checks_that_do_not_apply_are_left_out():
    out = Utf8Stream()
    results = run_checks([lambda: ok("a", "fine"), lambda: None], out)
    assert [r.name for r in results] == ["a"]
    assert out.getvalue() == "✓  a                fine\n"


def test_a_failure_exits_1_and_a_warning_exits_0(monkeypatch):
    monkeypatch.setattr(report, "QUICK_CHECKS", (lambda: warn("w", "m", "tip"),))
    out = io.StringIO()  # no encoding: the ASCII marks
    assert main(["--quick"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["!! w                m", "   tip: tip"]
    assert lines[-1].startswith("multigpu doctor: 0 OK 0 XX 1 warning | ")
    monkeypatch.setattr(report, "QUICK_CHECKS", (lambda: fail("f", "m", "do"),))
    out = io.StringIO()
    assert main(["--quick"], out) == 1
    assert "   fix: do" in out.getvalue().splitlines()


def test_json_holds_every_result_and_the_summary(monkeypatch):
    monkeypatch.setattr(
        report, "QUICK_CHECKS", (lambda: ok("a", "1"), lambda: fail("b", "2", "3"))
    )
    out = Utf8Stream()
    assert main(["--quick", "--json"], out) == 1
    record = json.loads(out.getvalue())
    assert record["results"] == [
        {"name": "a", "status": "ok", "measured": "1", "fix": ""},
        {"name": "b", "status": "fail", "measured": "2", "fix": "3"},
    ]
    assert record["summary"].startswith("multigpu doctor: 1 ✓ 1 ✗ 0 warnings | ")


def run_doctor(*options, encoding="utf-8", command=None):
    """``python -m multigpu.doctor`` (or ``command``) from a plain shell in the
    repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONIOENCODING"] = encoding
    start = time.monotonic()
    done = subprocess.run(
        command or [sys.executable, "-m", "multigpu.doctor", *options],
        cwd=project_root(),
        env=env,
        capture_output=True,
        text=True,
        encoding=encoding,
        timeout=90,
    )
    return done, time.monotonic() - start


def check_names(lines):
    """The names of the checks printed in ``lines`` (either kind of marks)."""
    marks = {*UNICODE_MARKS.values(), *ASCII_MARKS.values()}
    return [line[3:19].strip() for line in lines if line[:2].strip() in marks]


def test_make_doctor_passes_here_within_30_s():
    done, seconds = run_doctor(command=["make", "--no-print-directory", "doctor"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert SUMMARY.fullmatch(lines[-1]), lines[-1]
    names = check_names(lines)
    assert names[:3] == ["Python", "packages", "Jupyter kernel"]
    assert names[-2:] == ["gloo launch", "torchrun"]
    assert seconds < 30, f"the doctor took {seconds:.1f} s"


def test_quick_skips_the_launches_and_ascii_replaces_the_marks():
    done, _ = run_doctor("--quick", encoding="ascii")
    assert done.returncode == 0, done.stdout + done.stderr
    names = check_names(done.stdout.splitlines())
    assert names[:3] == ["Python", "packages", "Jupyter kernel"]
    assert names[-1] == "GPUs"  # no gloo launch, no torchrun
    assert "(--quick: launches skipped)" in done.stdout
    assert SUMMARY.fullmatch(done.stdout.strip().splitlines()[-1])
    assert done.stdout.isascii()


def test_quick_json_from_a_shell_that_cannot_write_the_marks():
    done, _ = run_doctor("--quick", "--json", encoding="ascii")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert [r["name"] for r in record["results"]][:2] == ["Python", "packages"]
    assert all(r["status"] != "fail" for r in record["results"])
    assert SUMMARY.fullmatch(record["summary"]), record["summary"]
