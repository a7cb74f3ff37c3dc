"""The browser run's comparison says what nbval would: the same markers, sanitizers,
stream joining and skipped keys. Runs everywhere (no browser needed)."""

from __future__ import annotations

import copy

from nbformat.v4 import new_code_cell, new_notebook, new_output

from tests.browser.lab import ROOT
from tests.browser.outputs import (
    cell_options,
    notebook_problems,
    output_differences,
    read_patterns,
)

PATTERNS = read_patterns(ROOT / "tests" / "nbval_sanitize.cfg")


def stdout(text):
    return new_output("stream", name="stdout", text=text)


def error(evalue):
    return new_output("error", ename="ValueError", evalue=evalue, traceback=["x"])


def cell(source, outputs, count=1, tags=()):
    code = new_code_cell(source, outputs=outputs, execution_count=count)
    if tags:
        code.metadata["tags"] = list(tags)
    return code


def notebook(*cells):
    return new_notebook(cells=list(cells))


def test_the_project_sanitizers_are_read_in_order():
    assert list(PATTERNS.values())[:2] == ["0xADDRESS", "TMPPATH"]


def test_markers_are_nbval_s():
    assert not cell_options(cell("# NBVAL_IGNORE_OUTPUT\nx", []))["check"]
    assert cell_options(cell("# NBVAL_SKIP\nx", []))["skip"]
    assert cell_options(cell("# NBVAL_RAISES_EXCEPTION\nx", []))["check_exception"]
    assert cell_options(cell("x", [], tags=["raises-exception"]))["check_exception"]
    assert cell_options(cell("x", []))["check"]


def test_equal_outputs_and_sanitized_differences_pass():
    stored = [stdout("at 0x7f3a2b4c5d60 in /tmp/abc/x.pt\n")]
    executed = [stdout("at 0x55aa11bb22cc in /tmp/pytest-of-root/y.pt\n")]
    assert output_differences(executed, stored, PATTERNS) == []


def test_split_streams_and_carriage_returns_compare_as_one_text():
    stored = [stdout("10%\r100%\ndone\n")]
    executed = [stdout("100%\n"), stdout("done\n")]
    assert output_differences(executed, stored, PATTERNS) == []


def test_images_and_metadata_are_not_compared():
    def figure(png, width):
        data = {"image/png": png, "text/plain": "<Figure>"}
        return new_output("display_data", data=data, metadata={"width": width})

    assert output_differences([figure("AAAA", 1)], [figure("BBBB", 2)], PATTERNS) == []


def test_a_changed_line_an_extra_output_and_a_missing_one_fail():
    stored = [stdout("loss 0.25\n")]
    assert "stdout differs" in output_differences([stdout("loss 0.5\n")], stored, {})[0]
    extra = [stdout("loss 0.25\n"), new_output("stream", name="stderr", text="w\n")]
    assert "unexpected output fields" in output_differences(extra, stored, {})[0]
    assert "missing output fields" in output_differences([], stored, {})[0]


def test_only_marked_cells_may_raise_and_their_error_is_compared():
    stored = notebook(
        cell("# NBVAL_RAISES_EXCEPTION\nf()", [error("bad")]),
        cell("g()", [error("bad")], tags=["raises-exception"]),
        cell("h()", [stdout("ok\n")]),
    )
    assert notebook_problems(copy.deepcopy(stored), stored, PATTERNS) == []
    executed = copy.deepcopy(stored)
    executed.cells[1].outputs[0].evalue = "worse"
    executed.cells[2].outputs = [error("boom")]
    problems = notebook_problems(executed, stored, PATTERNS)
    assert len(problems) == 2
    assert "evalue differs" in problems[0]
    assert "unexpected error ValueError: boom" in problems[1]


def test_an_error_counts_even_in_ignored_and_skipped_cells():
    stored = notebook(
        cell("# NBVAL_IGNORE_OUTPUT\nf()", [stdout("any\n")]),
        cell("# NBVAL_SKIP\ng()", [stdout("gpu only\n")]),
    )
    executed = copy.deepcopy(stored)
    executed.cells[0].outputs = [stdout("other\n")]
    executed.cells[1].outputs = [stdout("no gpu\n")]
    assert notebook_problems(executed, stored, PATTERNS) == []
    executed.cells[1].outputs = [error("no CUDA")]
    assert "unexpected error" in notebook_problems(executed, stored, PATTERNS)[0]


def test_cells_run_all_did_not_reach_are_listed():
    stored = notebook(cell("a", []), cell("b", []), cell("c", []))
    executed = copy.deepcopy(stored)
    executed.cells[1].execution_count = executed.cells[2].execution_count = None
    assert notebook_problems(executed, stored, PATTERNS) == [
        "code cells [1, 2] not run by Run All"
    ]
