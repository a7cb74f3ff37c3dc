"""Compare the stored outputs of every nbval-checked cell between two revisions.

    python bench/compare_notebook_outputs.py              # HEAD~1 against work tree
    python bench/compare_notebook_outputs.py 1a2b3c4      # a commit against work tree
    python bench/compare_notebook_outputs.py HEAD~3 HEAD  # two commits

A cell is checked when nbval compares its output: a code cell without
``# NBVAL_IGNORE_OUTPUT`` or ``# NBVAL_SKIP`` (nor the tags ``nbval-ignore-output``,
``nbval-skip``). Cells are matched by id across every notebook under ``notebooks/``,
and compared as nbval compares them: streams (consecutive ones joined), the
``text/plain`` of results and displays (figures' bytes are not compared), and an
error's name and value (not its traceback), after the replacements of
``tests/nbval_sanitize.cfg``. Prints "N of M checked cells identical" (M: the cells
checked in the old revision) and a unified diff per differing cell; a checked cell
gone from the new revision, or ignored there, differs. Exit 0 when every checked cell
is identical, 1 otherwise. Use it after ``make notebooks``, before committing.
"""

from __future__ import annotations

import argparse
import configparser
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = "notebooks"
SANITIZE = "tests/nbval_sanitize.cfg"
UNCHECKED = re.compile(r"^\s*#\s*NBVAL_(IGNORE_OUTPUT|SKIP)\b", re.MULTILINE)
UNCHECKED_TAGS = {"nbval-ignore-output", "nbval-skip"}

Sanitizer = list[tuple[re.Pattern, str]]


@dataclass
class Comparison:
    """The checked cells of two revisions of one notebook (or of many)."""

    total: int = 0  # cells checked in the old revision
    same: int = 0
    diffs: list[tuple[str, str]] = field(default_factory=list)  # (cell, diff)
    new_cells: list[str] = field(default_factory=list)  # checked only in the new one

    def add(self, other: Comparison) -> None:
        self.total += other.total
        self.same += other.same
        self.diffs += other.diffs
        self.new_cells += other.new_cells


def read_sanitizer(path: Path) -> Sanitizer:
    """The (regex, replacement) pairs of an nbval sanitize file (none if absent)."""
    if not path.is_file():
        return []
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return [
        (re.compile(parser[name]["regex"]), parser[name]["replace"])
        for name in parser.sections()
    ]


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _sanitize(text: str, sanitizer: Sanitizer) -> str:
    for pattern, replacement in sanitizer:
        text = pattern.sub(replacement, text)
    return text


def is_checked(cell: dict) -> bool:
    """Does nbval compare this cell's outputs?"""
    if cell["cell_type"] != "code":
        return False
    if UNCHECKED_TAGS & set(cell.get("metadata", {}).get("tags", [])):
        return False
    return not UNCHECKED.search(_text(cell["source"]))


def output_lines(cell: dict, sanitizer: Sanitizer = ()) -> list[str]:
    """The compared part of a cell's outputs, as lines: a ``[kind]`` line per output,
    then its text."""
    parts: list[tuple[str, str]] = []
    for output in cell.get("outputs", []):
        kind = output["output_type"]
        if kind == "stream":
            text = _text(output["text"])
            if parts and parts[-1][0] == output["name"]:  # nbval joins them too
                parts[-1] = (output["name"], parts[-1][1] + text)
            else:
                parts.append((output["name"], text))
        elif kind in ("execute_result", "display_data"):
            parts.append((kind, _text(output.get("data", {}).get("text/plain", ""))))
        elif kind == "error":
            parts.append((kind, f"{output['ename']}: {output['evalue']}"))
    lines = []
    for kind, text in parts:
        lines.append(f"[{kind}]")
        lines += _sanitize(text, sanitizer).splitlines()
    return lines


def checked_outputs(notebook: dict, sanitizer: Sanitizer = ()) -> dict[str, list]:
    """Cell id -> compared output lines, for every checked cell of ``notebook``."""
    return {
        cell["id"]: output_lines(cell, sanitizer)
        for cell in notebook["cells"]
        if is_checked(cell)
    }


def compare_notebooks(
    old: dict, new: dict, name: str = "notebook", sanitizer: Sanitizer = ()
) -> Comparison:
    """Compare the checked cells of two versions of one notebook (parsed JSON); the
    cells are named ``{name} cell {id}``."""
    before = checked_outputs(old, sanitizer)
    after = checked_outputs(new, sanitizer)
    result = Comparison(total=len(before))
    for cell_id, lines in before.items():
        label = f"{name} cell {cell_id}"
        if cell_id not in after:
            result.diffs.append((label, "cell gone, or its output is now ignored"))
        elif lines == after[cell_id]:
            result.same += 1
        else:
            diff = difflib.unified_diff(
                lines, after[cell_id], "old", "new", lineterm="", n=1
            )
            result.diffs.append((label, "\n".join(diff)))
    result.new_cells = [f"{name} cell {i}" for i in after if i not in before]
    return result


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def read_notebooks(repo: Path, revision: str | None) -> dict[str, dict]:
    """Path -> parsed notebook, for every notebook under ``notebooks/`` at
    ``revision`` (``git show REV:path``), or in the work tree when it is None (tracked
    and untracked, not ignored)."""
    if revision is None:
        listed = _git(repo, "ls-files", "-co", "--exclude-standard", "--", NOTEBOOKS)
    else:
        listed = _git(repo, "ls-tree", "-r", "--name-only", revision, "--", NOTEBOOKS)
    notebooks = {}
    for path in sorted(set(listed.splitlines())):
        if not path.endswith(".ipynb"):
            continue
        if revision is None:
            if not (repo / path).is_file():  # deleted, not yet staged
                continue
            text = (repo / path).read_text(encoding="utf-8")
        else:
            text = _git(repo, "show", f"{revision}:{path}")
        notebooks[path] = json.loads(text)
    return notebooks


def compare_revisions(
    repo: Path, old: str, new: str | None, sanitizer: Sanitizer = ()
) -> tuple[Comparison, list[str]]:
    """Compare every notebook of revision ``old`` with revision ``new`` (None: the
    work tree); also returns the notebooks the new revision lacks."""
    before, after = read_notebooks(repo, old), read_notebooks(repo, new)
    result, missing = Comparison(), []
    for path, notebook in before.items():
        if path in after:
            result.add(compare_notebooks(notebook, after[path], path, sanitizer))
        else:
            missing.append(path)
            checked = checked_outputs(notebook)
            result.total += len(checked)
            result.diffs += [(f"{path} cell {i}", "notebook gone") for i in checked]
    return result, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "old", nargs="?", default="HEAD~1", help="a git revision (default: HEAD~1)"
    )
    parser.add_argument(
        "new", nargs="?", default=None, help="a git revision (default: the work tree)"
    )
    parser.add_argument(
        "--repo", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    parser.add_argument(
        "--sanitize-with",
        default=SANITIZE,
        help=f"nbval's replacements, relative to the repository (default: {SANITIZE})",
    )
    options = parser.parse_args(argv)
    sanitizer = read_sanitizer(options.repo / options.sanitize_with)
    try:
        result, missing = compare_revisions(
            options.repo, options.old, options.new, sanitizer
        )
    except subprocess.CalledProcessError as error:
        print(f"git failed: {error.stderr.strip()}", file=sys.stderr)
        return 2
    new = options.new or "the work tree"
    print(f"{options.old} against {new}:")
    print(f"{result.same} of {result.total} checked cells identical")
    for path in missing:
        print(f"notebook gone: {path}")
    for label, diff in result.diffs:
        print(f"--- {label}\n{diff}")
    if result.new_cells:
        print(f"{len(result.new_cells)} checked cells only in {new} (not compared):")
        print("\n".join(f"  {label}" for label in result.new_cells))
    return 0 if result.same == result.total else 1


if __name__ == "__main__":
    sys.exit(main())
