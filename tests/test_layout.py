"""The package's floor plan, checked (docs/architecture.md): files small, docstrings
short, no import circle, rank functions only in ``multigpu.ranks``, tests through
public names only. `make lint` checks the import layers themselves (import-linter)."""

import ast
import inspect
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "multigpu"
MAX_LINES = 400
MAX_DOCSTRING_LINES = 30


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_source_file_is_longer_than_400_lines():
    long = {
        str(path.relative_to(ROOT)): count
        for path in _sources()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these files (one concept per file): {long}"


def test_module_docstrings_are_at_most_30_lines():
    long = {}
    for path in _sources():
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if len(docstring.splitlines()) > MAX_DOCSTRING_LINES:
            long[str(path.relative_to(ROOT))] = len(docstring.splitlines())
    assert long == {}, f"move the long explanation into docs/: {long}"


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_between_modules():
    graph = grimp.build_graph("multigpu")
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="a")
    graph.add_import(importer="b", imported="c")
    assert _cycles(graph) == [["a", "b"]]


def _rank_like(function) -> bool:
    """A function whose first two parameters are (rank, world_size): a rank function."""
    names = list(inspect.signature(function).parameters)[:2]
    return names == ["rank", "world_size"]


# The launcher's own machinery: what a started process runs first, and a function that
# runs other rank functions one after the other on the same ranks.
COMBINATORS = {
    "multigpu.runtime.launch._child.run_rank",
    "multigpu.runtime.launch.rank_functions.in_one_launch",
}


def test_rank_functions_live_in_ranks_and_are_named_rank():
    import importlib

    misplaced, misnamed = [], []
    for path in _sources():
        name = _module_name(path)
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if not inspect.isfunction(value) or value.__module__ != name:
                continue
            if not _rank_like(value) or attribute.startswith("_"):
                continue
            if f"{name}.{attribute}" in COMBINATORS:
                continue
            if not name.startswith("multigpu.ranks"):
                misplaced.append(f"{name}.{attribute}")
            elif not attribute.endswith("_rank"):
                misnamed.append(f"{name}.{attribute}")
    assert misplaced == [], "rank functions belong in multigpu.ranks"
    assert misnamed == [], "rank functions are named *_rank"


def _private_uses(tree: ast.Module) -> list[str]:
    """Private names of multigpu that a test file imports or reads as attributes."""
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "multigpu"
        ):
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append(node.module)
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("multigpu"):
                    aliases.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "from multigpu.runtime.launch import _child",
            ["multigpu.runtime.launch._child"],
        ),
        ("from multigpu.zero import _flat", ["multigpu.zero._flat"]),
        ("from multigpu import zero\nzero._helper()", ["zero._helper"]),
        ("from multigpu import zero\nzero.helper()", []),
    ],
)
def test_the_private_name_finder(source, expected):
    assert _private_uses(ast.parse(source)) == expected


def test_tests_use_public_names_only():
    uses = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (found := _private_uses(ast.parse(path.read_text())))
    }
    assert uses == {}, "test through the public API"
