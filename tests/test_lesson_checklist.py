"""A lesson's checklist is a test (docs/architecture.md, "Adding a lesson").

Every row of tests/lessons.py must have each piece a lesson adds: its notebook and
solutions notebook, the previous lesson's Next link, its code, rank modules and
checkers (or a declared ``Without`` that holds), its tests, its layer in the import
contract, its README row, its line in docs/architecture.md's tree, its rows in
docs/instructors.md and its entry in the answers map of
tests/test_lessons_hide_answers.py. A missing piece fails with one line naming it.
The docs' tree and lesson order are checked against src/multigpu and the contract.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import tomllib

from tests.lessons import LESSONS, NOT_LESSONS, RANKS_OF_NO_LESSON, Lesson, Without

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = {name.rstrip("/") for name in NOT_LESSONS}
# The folders docs/architecture.md's tree lists module by module.
LISTED_BY_NAME = ("core", "runtime", "costmodel", "ranks", "exercises", "plots")


@dataclass(frozen=True)
class Repo:
    """The texts the checklist reads, from one checkout (or a changed copy of it)."""

    root: Path
    readme: str
    architecture: str
    instructors: str
    layers: tuple[frozenset[str], ...]  # the contract's lesson layers, top first

    @classmethod
    def read(cls, root: Path) -> Repo:
        text = {name: (root / name).read_text(encoding="utf-8") for name in FILES}
        return cls(
            root=root,
            readme=text["README.md"],
            architecture=text["docs/architecture.md"],
            instructors=text["docs/instructors.md"],
            layers=contract_layers(text["pyproject.toml"]),
        )

    def module(self, folder: str, name: str) -> Path | None:
        """src/multigpu/<folder>/<name>.py, or the package <name>/, if it exists."""
        base = self.root / "src" / "multigpu" / folder
        for path in (base / f"{name}.py", base / name / "__init__.py"):
            if path.is_file():
                return path.parent if path.name == "__init__.py" else path
        return None


FILES = (
    "README.md",
    "docs/architecture.md",
    "docs/instructors.md",
    "pyproject.toml",
)


@functools.cache
def package_sources(root: Path) -> tuple[str, ...]:
    """The text of every module of src/multigpu, read once."""
    files = sorted((root / "src" / "multigpu").rglob("*.py"))
    return tuple(path.read_text(encoding="utf-8") for path in files)


def defined_in_package(root: Path, name: str) -> bool:
    """Does some module of src/multigpu define a function or class ``name``?"""
    pattern = re.compile(rf"^\s*(?:async def|def|class) {re.escape(name)}\b", re.M)
    return any(pattern.search(text) for text in package_sources(root))


def contract_layers(pyproject: str) -> tuple[frozenset[str], ...]:
    contracts = tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    names = [
        frozenset(n.strip().removeprefix("multigpu.") for n in layer.split("|"))
        for layer in layers
    ]
    return tuple(layer for layer in names if not layer & SUPPORT)


def section(markdown: str, title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading ("" if none)."""
    match = re.search(
        rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.M | re.S
    )
    return match.group(1) if match else ""


def fenced(text: str) -> str:
    match = re.search(r"```\n(.*?)```", text, re.S)
    return match.group(1) if match else ""


def tree_entries(architecture: str) -> dict[str, str]:
    """docs/architecture.md's tree of src/multigpu/: entry ("ddp/") -> its text."""
    entries: dict[str, str] = {}
    current = None
    for line in fenced(section(architecture, "The tree")).splitlines():
        if not line.startswith(" "):  # src/multigpu/, tests/, bench/
            current = None
        elif not line.startswith("   "):  # two spaces: an entry of src/multigpu/
            current, _, rest = line.strip().partition(" ")
            entries[current] = rest
        elif current:
            entries[current] += " " + line.strip()
    return entries


def lesson_order(architecture: str) -> tuple[frozenset[str], ...]:
    """docs/architecture.md's lesson order: each line's names, top first."""
    lines = fenced(section(architecture, "The layers")).splitlines()
    names = [re.split(r"\s{2,}", line.strip())[0] for line in lines if line.strip()]
    return tuple(frozenset(n.strip() for n in line.split("|")) for line in names)


def names_lesson(text: str, number: str) -> bool:
    """Whether ``text`` names lesson ``number`` ("09b"), alone or in a range."""
    value = int(re.match(r"\d+", number).group())
    ranges = re.findall(r"\b(\d\d)-(\d\d)\b", text)
    return bool(re.search(rf"\b{number}\b", text)) or any(
        int(a) <= value <= int(b) for a, b in ranges
    )


def references(text: str, package: str) -> set[str]:
    """The modules of multigpu.<package> that ``text`` imports or names."""
    found = set(re.findall(rf"multigpu\.{package}\.(\w+)", text))
    for listed in re.findall(rf"from multigpu\.{package} import (\([^)]*\)|.*)", text):
        names = re.sub(r"#.*", "", listed).strip().strip("()").split(",")
        found |= {name.split(" as ")[0].strip() for name in names}
    return {name for name in found if name.isidentifier() and name[0] != "_"}


@functools.cache
def notebook(path: Path) -> tuple[str, str] | None:
    """(code, markdown) of a notebook, or None if there is no such file."""
    if not path.is_file():
        return None
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    kinds = [[c for c in cells if c["cell_type"] == k] for k in ("code", "markdown")]
    code, markdown = ("\n".join("".join(c["source"]) for c in k) for k in kinds)
    return code, markdown


def source(path: Path | None) -> str:
    files = [] if path is None else [path] if path.is_file() else path.rglob("*.py")
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def check_functions(path: Path) -> list[str]:
    """The ``check_*`` functions a checker module defines."""
    tree = ast.parse(source(path))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
    ]


def public_modules(folder: Path) -> set[str]:
    """The modules and subpackages of ``folder`` a notebook or test may import."""
    if not folder.is_dir():
        return set()
    files = {p.stem for p in folder.glob("*.py")}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return {name for name in files | packages if not name.startswith("_")}


def src_entries(src: Path) -> set[str]:
    """The top-level entries of src/multigpu/ as the tree writes them: "ddp/"."""
    return {f"{name}/" for name in public_modules(src) if (src / name).is_dir()} | {
        f"{name}.py" for name in public_modules(src) if (src / f"{name}.py").is_file()
    }


def top(path: str) -> str:
    """The top-level name of a code path: "core/devices.py" -> "core"."""
    return path.split("/")[0].removesuffix(".py")


def lesson_packages(lesson: Lesson) -> list[str]:
    """The code paths that are the lesson's own (not under core/ or runtime/)."""
    return [path for path in lesson.code if top(path) not in SUPPORT]


def mirror_of(path: str) -> str:
    """Where the tests of src/multigpu/<path> live (docs/architecture.md, "A test")."""
    folder, _, name = path.rpartition("/")
    if not name:
        return f"tests/{path}"
    return f"tests/{folder}/test_{name}".replace("//", "/")


def links(markdown: str, label: str, target: str) -> bool:
    """Whether a line of ``markdown`` holding **label** (any case) links ``target``."""
    lines = [line for line in markdown.splitlines() if f"**{label}**" in line.lower()]
    return any(f"]({target})" in line for line in lines)


def lesson_notebooks(lesson: Lesson) -> tuple[str, str]:
    """The lesson's notebook and its solutions notebook, under notebooks/."""
    stem = lesson.notebook
    return f"{stem}.ipynb", f"solutions/{stem}_solutions.ipynb"


@functools.cache
def exercise_tests(root: Path) -> tuple[str, ...]:
    return tuple(source(p) for p in sorted(root.glob("tests/exercises/test_*.py")))


# Each check takes (lesson, the lesson before it or None, repo) and returns one line
# per missing piece, starting with the piece's name.


def notebook_pieces(lesson: Lesson, previous: Lesson | None, repo: Repo) -> list[str]:
    books, (own, answers) = repo.root / "notebooks", lesson_notebooks(lesson)
    missing = []
    if notebook(books / own) is None:
        missing.append(f"notebook: notebooks/{own} does not exist")
    solutions = notebook(books / answers)
    if solutions is None:
        missing.append(f"solutions notebook: notebooks/{answers} does not exist")
    elif not links(solutions[1], "back to", f"../{own}"):
        missing.append(
            f"solutions notebook: notebooks/{answers} has no **Back to** link to "
            f"../{own}"
        )
    if previous is not None:
        before, before_answers = lesson_notebooks(previous)
        for where, target in ((before, own), (before_answers, f"../{own}")):
            found = notebook(books / where)
            if found is None or not links(found[1], "next", target):
                missing.append(
                    f"Next link: notebooks/{where} has no **Next** link to {target}"
                )
    return missing


def uses(lesson: Lesson, repo: Repo, folder: str) -> dict[str, str]:
    """The modules of multigpu.<folder> that the lesson's notebooks and checkers
    use, each with the first place that uses it."""
    places = []
    for name in lesson_notebooks(lesson):
        if (found := notebook(repo.root / "notebooks" / name)) is not None:
            places.append((f"notebooks/{name}", found[0]))
    for checker in lesson.checkers if isinstance(lesson.checkers, tuple) else ():
        if (path := repo.module("exercises", checker)) is not None:
            places.append((f"src/multigpu/exercises/{checker}.py", source(path)))
    used: dict[str, str] = {}
    for place, text in places:
        for name in sorted(references(text, folder)):
            used.setdefault(name, place)
    return used


def declared_pieces(lesson: Lesson, repo: Repo, folder: str) -> list[str]:
    """The rank modules (folder "ranks") or checkers ("exercises") of the row."""
    piece = {"ranks": "rank module", "exercises": "checker module"}[folder]
    field = {"ranks": "ranks", "exercises": "checkers"}[folder]
    declared = getattr(lesson, field)
    used = uses(lesson, repo, folder)
    if isinstance(declared, Without):
        return [
            f"{piece}: tests/lessons.py says there is none ({declared.why}), but "
            f"{place} uses multigpu.{folder}.{name}: name it in the row instead"
            for name, place in used.items()
        ]
    if not declared:
        return [f"{piece}: the row's {field} is empty: name them or say Without(why)"]
    missing = []
    for name in declared:
        if repo.module(folder, name) is None:
            missing.append(
                f"{piece}: src/multigpu/{folder}/{name}.py does not exist (write it, "
                f"or say {field}=Without(why) in tests/lessons.py)"
            )
        elif name not in used:
            missing.append(
                f"{piece}: tests/lessons.py names src/multigpu/{folder}/{name}.py, "
                "but no notebook or checker of this lesson uses it: take it out"
            )
    missing += [
        f"{piece}: {place} uses multigpu.{folder}.{name}, which the row in "
        "tests/lessons.py does not name: add it"
        for name, place in used.items()
        if name not in declared
    ]
    return missing


def code_and_test_pieces(lesson: Lesson, previous: Lesson | None, repo: Repo) -> list:
    missing = []
    for path in lesson.code:
        if not (repo.root / "src" / "multigpu" / path).exists():
            missing.append(f"lesson code: src/multigpu/{path} does not exist")
        mirror = repo.root / mirror_of(path)
        tested = mirror.is_file() or any(mirror.rglob("test_*.py"))
        if not tested:
            missing.append(
                f"tests: {mirror_of(path)} has no tests of src/multigpu/{path}"
            )
    missing += declared_pieces(lesson, repo, "ranks")
    missing += declared_pieces(lesson, repo, "exercises")
    checkers = lesson.checkers if isinstance(lesson.checkers, tuple) else ()
    for checker in checkers:
        tests = exercise_tests(repo.root)
        if not any(checker in references(text, "exercises") for text in tests):
            missing.append(
                f"tests: no tests/exercises/test_*.py imports "
                f"multigpu.exercises.{checker}"
            )
    return missing


def contract_and_docs_pieces(
    lesson: Lesson, previous: Lesson | None, repo: Repo
) -> list[str]:
    missing, number = [], lesson.number
    tree, order = tree_entries(repo.architecture), lesson_order(repo.architecture)
    for path in lesson_packages(lesson):
        name, entry = top(path), path.split("/")[0] + ("/" if "/" in path else "")
        if not any(name in layer for layer in repo.layers):
            missing.append(
                f"contract layer: pyproject.toml's import contract has no layer "
                f"naming multigpu.{name}"
            )
        if entry not in tree:
            missing.append(
                f"architecture entry: docs/architecture.md's tree has no line {entry}"
            )
        elif not names_lesson(tree[entry], number):
            missing.append(
                f"architecture entry: docs/architecture.md's tree line {entry} does "
                f"not name lesson {number}"
            )
        if not any(name in line for line in order):
            missing.append(
                f"architecture entry: docs/architecture.md's lesson order does not "
                f"list {name}"
            )
    missing += readme_pieces(lesson, repo)
    missing += instructor_pieces(lesson, repo)
    if isinstance(lesson.checkers, tuple) and not lesson.answers:
        missing.append(
            f"answers: the row of {lesson.notebook} in tests/lessons.py names no "
            "function whose source answers its exercises"
        )

    return missing


def readme_pieces(lesson: Lesson, repo: Repo) -> list[str]:
    link = f"(notebooks/{lesson.notebook}.ipynb)"
    rows = section(repo.readme, "The notebooks").splitlines()
    row = next((line for line in rows if link in line), None)
    if row is None:
        return [f"README row: README.md's notebook map has no row linking {link[1:-1]}"]
    *_, modules, tests = row.strip().strip("|").split(" | ")
    missing = []
    for path in lesson.code:
        if f"`{path}`" not in modules:
            missing.append(
                f"README row: the row of {lesson.number} does not name `{path}` in "
                "its module column"
            )
        if f"`{mirror_of(path)}`" not in tests:
            missing.append(
                f"README row: the row of {lesson.number} does not name "
                f"`{mirror_of(path)}` in its tests column"
            )
    return missing


def lesson_tables(markdown: str) -> list[tuple[str, list[str]]]:
    """The tables with one row per lesson or per exercise (their first column is
    "#"): (the heading above and the header, the rows)."""
    tables, heading, lines = [], "", markdown.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("#"):
            heading = line.lstrip("# ")
        elif line.startswith("| # |") and not lines[index - 1].startswith("|"):
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(row)
            tables.append((f"{heading!r}, table {line.strip()!r}", rows))
    return tables


def instructor_pieces(lesson: Lesson, repo: Repo) -> list[str]:
    number, missing = lesson.number, []
    for title, rows in lesson_tables(repo.instructors):
        per_exercise = any(re.match(r"\| \d\d[a-z]?\.\d", row) for row in rows)
        own = rows_of(rows, number, per_exercise)
        if not own:
            row = f"{number}.1" if per_exercise else number
            missing.append(
                f"instructor guide: docs/instructors.md's {title} has no row {row}"
            )
        elif per_exercise:
            missing += checkers_named(lesson, repo, "\n".join(own))
    return missing


def rows_of(rows: list[str], number: str, per_exercise: bool) -> list[str]:
    first = rf"\| {number}\.\d+\b" if per_exercise else rf"\| {number} \|"
    return [row for row in rows if re.match(first, row)]


def checkers_named(lesson: Lesson, repo: Repo, rows: str) -> list[str]:
    """Each checker of the lesson has a check_ function its exercise rows name."""
    missing = []
    for checker in lesson.checkers if isinstance(lesson.checkers, tuple) else ():
        path = repo.module("exercises", checker)
        functions = check_functions(path) if path is not None else []
        if path is not None and not any(f in rows for f in functions):
            missing.append(
                f"instructor guide: docs/instructors.md's exercise rows "
                f"{lesson.number}.* name no check_ function of exercises/{checker}.py "
                f"({', '.join(functions)})"
            )
    return missing


CHECKS = (notebook_pieces, code_and_test_pieces, contract_and_docs_pieces)


def missing_pieces(lesson: Lesson, previous: Lesson | None, repo: Repo) -> list[str]:
    """One line per piece of docs/architecture.md's "Adding a lesson" the lesson
    lacks, each naming the piece and the file."""
    return [line for check in CHECKS for line in check(lesson, previous, repo)]


def tree_drift(architecture: str, src: Path) -> list[str]:
    """Where docs/architecture.md's tree and ``src`` (src/multigpu) differ."""
    tree, real = tree_entries(architecture), src_entries(src)
    drift = [f"the tree has no line {e}" for e in sorted(real - tree.keys())]
    drift += [
        f"the tree lists {e}, which is not there" for e in sorted(tree.keys() - real)
    ]
    for folder in LISTED_BY_NAME:
        words = set(re.findall(r"\w+", tree.get(f"{folder}/", "")))
        drift += [
            f"the tree's line {folder}/ does not name {name} (src/multigpu/{folder}/)"
            for name in sorted(public_modules(src / folder) - words)
        ]
    return drift


# The checks of today's checkout.


@pytest.fixture(scope="module")
def repo() -> Repo:
    return Repo.read(ROOT)


@pytest.mark.parametrize(
    "index", range(len(LESSONS)), ids=[lesson.notebook for lesson in LESSONS]
)
def test_the_lesson_has_every_piece(index, repo):
    lesson, previous = LESSONS[index], LESSONS[index - 1] if index else None
    missing = missing_pieces(lesson, previous, repo)
    assert missing == [], (
        f"{lesson.notebook} lacks (docs/architecture.md, 'Adding a lesson'):\n- "
        + "\n- ".join(missing)
    )


def test_every_notebook_has_a_row_in_the_series_order():
    stems = [path.stem for path in sorted(ROOT.glob("notebooks/[0-9]*.ipynb"))]
    rows = [lesson.notebook for lesson in LESSONS]
    assert sorted(set(stems) - set(rows)) == [], (
        "add these notebooks' rows to tests/lessons.py"
    )
    assert sorted(set(rows) - set(stems)) == [], (
        "tests/lessons.py names no such notebook"
    )
    assert rows == stems, "tests/lessons.py lists the lessons in notebooks/'s order"


def test_everything_in_src_is_a_lessons_or_said_why_not():
    src = ROOT / "src" / "multigpu"
    claimed = {
        path.split("/")[0] + ("/" if "/" in path else "")
        for lesson in LESSONS
        for path in lesson.code
    }
    claimed |= set(NOT_LESSONS)
    assert sorted(src_entries(src) - claimed) == [], (
        "add it to the code of the lesson that teaches it in tests/lessons.py, or to "
        "NOT_LESSONS saying why it is no lesson's"
    )
    assert sorted(claimed - src_entries(src)) == [], (
        "tests/lessons.py names no such code"
    )


@pytest.mark.parametrize("folder", ["ranks", "exercises"])
def test_every_rank_module_and_checker_is_a_lessons(folder):
    declared = set(RANKS_OF_NO_LESSON) if folder == "ranks" else set()
    for lesson in LESSONS:
        names = lesson.ranks if folder == "ranks" else lesson.checkers
        declared |= set(names) if isinstance(names, tuple) else set()
    real = public_modules(ROOT / "src" / "multigpu" / folder)
    assert sorted(real - declared) == [], (
        f"src/multigpu/{folder}/ holds modules no row of tests/lessons.py names: "
        "add each to the row of the lesson that uses it"
    )
    assert sorted(declared - real) == [], f"no such module in src/multigpu/{folder}/"


def test_the_docs_tree_is_the_real_tree(repo):
    drift = tree_drift(repo.architecture, ROOT / "src" / "multigpu")
    assert drift == [], "docs/architecture.md, The tree: " + "; ".join(drift)


def test_the_docs_lesson_order_is_the_contract(repo):
    def lines(layers):
        return [" | ".join(sorted(layer)) for layer in layers]

    assert lines(lesson_order(repo.architecture)) == lines(repo.layers), (
        "docs/architecture.md's lesson order differs from pyproject.toml's "
        "[tool.importlinter] layers: copy the contract's lines"
    )


def test_a_row_without_answers_or_with_an_unknown_one_is_named(repo):
    missing = missing_pieces(replace(PIPELINE, answers=()), BEFORE, repo)
    assert [line.split(":")[0] for line in missing] == ["answers"], missing
    assert "16_pipeline_parallel" in missing[0]


@pytest.mark.parametrize(
    "lesson", [lesson for lesson in LESSONS if lesson.answers], ids=lambda x: x.number
)
def test_every_answer_a_row_names_is_defined_in_the_package(lesson):
    unknown = [name for name in lesson.answers if not defined_in_package(ROOT, name)]
    assert unknown == [], f"{lesson.notebook}'s answers name no function of src/"


def test_defined_in_package_finds_functions_and_classes_only():
    assert defined_in_package(ROOT, "one_f_one_b_actions")
    assert defined_in_package(ROOT, "BucketedDDP")
    assert not defined_in_package(ROOT, "no_such_function")
    assert not defined_in_package(ROOT, "one_f_one_b")  # a prefix is no match


# The checklist itself: each piece, taken away from a copy of the checkout, is named.

# Lesson 16 and the lesson before it; the pieces below are 16's.
_AT = next(index for index, lesson in enumerate(LESSONS) if lesson.number == "16")
PIPELINE, BEFORE = LESSONS[_AT], LESSONS[_AT - 1]


def changed_copy(tmp_path: Path, changes: dict[str, Callable[[str], str] | None]):
    """A checkout made of symbolic links to this one, except each path of
    ``changes``: removed (None) or a file rewritten by the function."""
    opened: set[Path] = set()

    def open_up(folder: Path) -> None:  # a real folder linking to ROOT's entries
        if folder in opened:
            return
        if folder != Path("."):
            open_up(folder.parent)
            (tmp_path / folder).unlink()
        (tmp_path / folder).mkdir(exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            (tmp_path / folder / entry.name).symlink_to(entry)
        opened.add(folder)

    for relative, change in changes.items():
        open_up(Path(relative).parent)
        (tmp_path / relative).unlink()
        if change is not None:
            text = (ROOT / relative).read_text(encoding="utf-8")
            (tmp_path / relative).write_text(change(text), encoding="utf-8")
    return tmp_path


def without_line(marker: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        kept = [line for line in text.splitlines(True) if marker not in line]
        assert len(kept) == len(text.splitlines(True)) - 1, marker
        return "".join(kept)

    return change


# piece -> (the path changed in the copy, how: None removes it, what the line names)
REMOVALS = {
    "notebook": (
        "notebooks/16_pipeline_parallel.ipynb",
        None,
        "notebooks/16_pipeline_parallel.ipynb",
    ),
    "solutions notebook": (
        "notebooks/solutions/16_pipeline_parallel_solutions.ipynb",
        None,
        "notebooks/solutions/16_pipeline_parallel_solutions.ipynb",
    ),
    "Next link": (
        f"notebooks/{BEFORE.notebook}.ipynb",
        lambda text: text.replace("](16_pipeline_parallel.ipynb)", "]()"),
        f"notebooks/{BEFORE.notebook}.ipynb",
    ),
    "rank module": (
        "src/multigpu/ranks/pipeline.py",
        None,
        "src/multigpu/ranks/pipeline.py",
    ),
    "checker module": (
        "src/multigpu/exercises/pipeline.py",
        None,
        "src/multigpu/exercises/pipeline.py",
    ),
    "tests": ("tests/pipeline", None, "tests/pipeline/"),
    "contract layer": (
        "pyproject.toml",
        lambda text: text.replace(
            "multigpu.fsdp2 | multigpu.pipeline", "multigpu.fsdp2"
        ),
        "multigpu.pipeline",
    ),
    "architecture entry": (
        "docs/architecture.md",
        without_line("  pipeline/ "),
        "pipeline/",
    ),
    "README row": (
        "README.md",
        without_line("(notebooks/16_pipeline_parallel.ipynb)"),
        "notebooks/16_pipeline_parallel.ipynb",
    ),
    "instructor guide": (
        "docs/instructors.md",
        without_line("| 16 | pipeline"),
        "row 16",
    ),
}


@pytest.mark.parametrize("piece", list(REMOVALS))
def test_a_piece_taken_away_is_named(piece, tmp_path):
    relative, change, named = REMOVALS[piece]
    copy = Repo.read(changed_copy(tmp_path, {relative: change}))
    missing = missing_pieces(PIPELINE, BEFORE, copy)
    assert [line.split(":")[0] for line in missing] == [piece], missing
    assert named in missing[0]


def test_the_copy_alone_misses_nothing(tmp_path):
    copy = Repo.read(changed_copy(tmp_path, {"README.md": lambda text: text}))
    assert copy.root != ROOT
    assert missing_pieces(PIPELINE, BEFORE, copy) == []


@pytest.mark.parametrize(
    "field, folder", [("ranks", "ranks"), ("checkers", "exercises")]
)
def test_a_without_that_went_stale_is_named(field, folder, repo):
    lesson = replace(PIPELINE, **{field: Without("a reason no longer true")})
    missing = missing_pieces(lesson, BEFORE, repo)
    assert len(missing) == 1, missing
    assert f"uses multigpu.{folder}.pipeline" in missing[0]
    assert "(a reason no longer true)" in missing[0]


def test_a_rank_module_named_but_unused_or_used_but_unnamed_is_named(repo):
    extra = missing_pieces(
        replace(PIPELINE, ranks=("pipeline", "dtensor")), BEFORE, repo
    )
    assert len(extra) == 1 and "ranks/dtensor.py" in extra[0], extra
    assert "no notebook or checker of this lesson uses it" in extra[0]
    unnamed = missing_pieces(replace(PIPELINE, ranks=("dtensor",)), BEFORE, repo)
    assert any("uses multigpu.ranks.pipeline" in line for line in unnamed), unnamed
    empty = missing_pieces(replace(PIPELINE, ranks=()), BEFORE, repo)
    assert len(empty) == 1 and "Without(why)" in empty[0], empty


def test_a_new_lesson_is_told_every_piece_it_lacks(repo):
    new = Lesson(
        "99_lesson_to_come",
        ("lesson_to_come/",),
        ("lesson_to_come",),
        ("lesson_to_come",),
    )
    missing = missing_pieces(new, LESSONS[-1], repo)
    pieces = {line.split(":")[0] for line in missing}
    assert pieces == {*REMOVALS, "lesson code", "answers"}, missing
    assert all("99" in line or "lesson_to_come" in line for line in missing)


def test_the_tree_check_names_an_unlisted_module_and_a_stale_line(tmp_path):
    for name in ("__init__.py", "plots/__init__.py", "plots/a.py", "plots/b.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "plots" / "_private.py").write_text("")
    architecture = (
        "## The tree\n\n```\nsrc/multigpu/\n  plots/    a (02)\n"
        "  gone.py   07\ntests/   mirrors\n```\n"
    )
    drift = tree_drift(architecture, tmp_path)
    assert len(drift) == 2, drift
    assert "gone.py" in drift[0] and "not there" in drift[0]
    assert "plots/" in drift[1] and "does not name b " in drift[1]


@pytest.mark.parametrize(
    "text, number, named",
    [
        ("02-06: PyTorch's", "04", True),
        ("09, 09b: loader", "09b", True),
        ("09b: a synchronized", "09", False),
        ("14b: FSDP2's", "14", False),
        ("07, 12-16: communication", "14b", True),
        ("13: flat buffers", "16", False),
    ],
)
def test_names_lesson(text, number, named):
    assert names_lesson(text, number) is named


def test_references_reads_imports_and_dotted_names():
    text = (
        "from multigpu.ranks import (\n    zero as zero_ranks,\n    dtensor,\n)\n"
        "import multigpu.ranks.fsdp\n"
        "torchrun -m multigpu.ranks.torchrun_example\n"
        "from multigpu.ranks._private import x\n"
    )
    assert references(text, "ranks") == {"zero", "dtensor", "fsdp", "torchrun_example"}
