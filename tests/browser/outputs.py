"""What nbval would say about a notebook that JupyterLab's Run All executed.

``notebook_problems(executed, stored, patterns)`` compares each code cell of the
executed notebook with the stored one the way ``pytest --nbval`` compares a cell it
ran (nbval 0.11, ``IPyNbCell.compare_outputs``): streams of one name joined and
their ``\\r``/``\\b`` applied (nbval's own ``coalesce_streams``), every output key and
MIME type compared except those nbval skips (metadata, tracebacks, execution counts,
images, widget ids), the ``tests/nbval_sanitize.cfg`` substitutions applied first.
Markers are nbval's too: ``# NBVAL_IGNORE_OUTPUT`` and ``# NBVAL_SKIP`` cells are not
compared, and only cells tagged ``raises-exception`` or marked
``# NBVAL_RAISES_EXCEPTION`` may hold an error. Unlike nbval, Run All also runs the
``NBVAL_SKIP`` cells, so an error there counts too.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict, defaultdict
from pathlib import Path

from nbval.plugin import (
    coalesce_streams,
    find_comment_markers,
    find_metadata_tags,
    get_sanitize_patterns,
)

# nbval's IPyNbFile.skip_compare without --nbdime (which adds the images).
SKIPPED_KEYS = frozenset(
    {
        "metadata",
        "traceback",
        "prompt_number",
        "output_type",
        "name",
        "execution_count",
        "application/vnd.jupyter.widget-view+json",
        "image/png",
        "image/jpeg",
    }
)


def read_patterns(path: Path) -> OrderedDict[str, str]:
    """The regex -> replacement pairs of an nbval sanitize file, in order."""
    return OrderedDict(get_sanitize_patterns(path.read_text(encoding="utf-8")))


def cell_options(cell) -> dict:
    """nbval's options for a code cell: tags first, then comments (which win)."""
    options = defaultdict(bool, find_metadata_tags(cell.metadata))
    options.update(dict(find_comment_markers(cell.source)))
    options.setdefault("check", True)
    return options


def sanitize(value, patterns):
    if not isinstance(value, str):
        return value
    for regex, replacement in patterns.items():
        value = re.sub(regex, replacement, value)
    return value


def flatten(outputs, patterns) -> dict[str, list]:
    """nbval's view of a cell's outputs: key (stream name, MIME type, ename, ...)
    -> its sanitized values in order."""
    flat = defaultdict(list)
    for output in coalesce_streams(copy.deepcopy(list(outputs))):
        if output.output_type == "stream":
            output = {"output_type": "stream", output.name: output.text}
        for key, value in output.items():
            if key in SKIPPED_KEYS:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIPPED_KEYS:
                        flat[mime].append(sanitize(data, patterns))
            else:
                flat[key].append(sanitize(value, patterns))
    return flat


def output_differences(executed, stored, patterns) -> list[str]:
    """Why nbval would call these outputs different ([] when it would not)."""
    got, want = flatten(executed, patterns), flatten(stored, patterns)
    if set(want) - set(got):
        return [f"missing output fields: {sorted(set(want) - set(got))}"]
    if set(got) - set(want):
        return [f"unexpected output fields: {sorted(set(got) - set(want))}"]
    for key, wanted in want.items():
        if len(got[key]) != len(wanted):
            return [f"{key}: {len(got[key])} outputs, stored {len(wanted)}"]
        for new, old in zip(got[key], wanted):
            if new != old:
                return [f"{key} differs:\n--- stored\n{old}\n+++ Run All\n{new}"]
    return []


def errors_in(outputs) -> list[str]:
    return [
        f"{output.ename}: {output.evalue}"
        for output in outputs
        if output.output_type == "error"
    ]


def notebook_problems(executed, stored, patterns) -> list[str]:
    """Every problem nbval (or Run All) would report, one string per cell."""
    run = [cell for cell in executed.cells if cell.cell_type == "code"]
    kept = [cell for cell in stored.cells if cell.cell_type == "code"]
    if len(run) != len(kept):
        return [f"{len(run)} code cells after Run All, {len(kept)} stored"]
    problems, unrun = [], []
    for number, (new, old) in enumerate(zip(run, kept)):
        where = f"code cell {number} ({(old.source.splitlines() or [''])[0][:60]!r})"
        options = cell_options(old)
        if new.execution_count is None:
            unrun.append(number)
            continue
        errors = errors_in(new.outputs)
        if errors and not options["check_exception"]:
            problems.append(f"{where}: unexpected error {errors[0]}")
            continue
        if options["skip"] or not options["check"] or old.execution_count is None:
            continue
        problems += [
            f"{where}: {difference}"
            for difference in output_differences(new.outputs, old.outputs, patterns)
        ]
    if unrun:
        problems.append(f"code cells {unrun} not run by Run All")
    return problems
