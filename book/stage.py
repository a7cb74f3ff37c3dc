"""Stage the course site's sources in one folder for Sphinx (`make site`).

Usage: python book/stage.py DEST (DEST is build/site-src).

Copies README.md (the front page), docs/*.md and every notebook WITH its stored
outputs (nothing is executed), adds to each lesson a note that links its solutions
notebook and the source of its modules (README's "module" column), writes one page
per top-level module of src/multigpu, and the contents in the series' order.
A file is rewritten only when its text changed, so Sphinx rebuilds only those.
SITE_REPO_URL (e.g. https://github.com/OWNER/multigpu) adds links to GitHub; by
default it is the git remote "origin" when that is on GitHub.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "multigpu"
NOTEBOOKS = ROOT / "notebooks"


WRITTEN: set[Path] = set()
# The front page of each folder: a page this script writes into the staged tree
# (build/site-src), not a file of the repository.
STAGED_INDEX = "index" + ".md"


def write(path: Path, text: str) -> None:
    """Write `text` to `path` unless it already holds exactly that."""
    WRITTEN.add(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def repository_url() -> str:
    """SITE_REPO_URL, else origin's https address when on GitHub, else ''."""
    url = os.environ.get("SITE_REPO_URL", "")
    if not url:
        found = subprocess.run(
            ["git", "-C", str(ROOT), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if "github.com" in found:
            url = re.sub(r"^git@github\.com:", "https://github.com/", found)
    return url.removesuffix(".git").rstrip("/")


def github_link(repo: str, relative: str) -> str:
    """A markdown link to src/multigpu/<relative> on GitHub ('' without a repo)."""
    if not repo:
        return ""
    branch = os.environ.get("SITE_REPO_BRANCH", "main")
    kind = "tree" if relative.endswith("/") else "blob"
    return f"[on GitHub]({repo}/{kind}/{branch}/src/multigpu/{relative})"


def label(relative: str) -> str:
    """The MyST target of a path under src/multigpu: `ddp/` -> `src-ddp`."""
    return "src-" + re.sub(r"[^a-z0-9]+", "-", relative.lower()).strip("-")


def units() -> list[Path]:
    """The top-level modules and packages of src/multigpu, one page each."""
    found = []
    for path in sorted(SRC.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            found.append(path)
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.append(path)
    return found


def readme_modules() -> dict[str, list[str]]:
    """Lesson number -> the paths in README's "module (`src/multigpu/`)" column."""
    rows: dict[str, list[str]] = {}
    column = None
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None and any(cell.startswith("module") for cell in cells):
            column = next(i for i, c in enumerate(cells) if c.startswith("module"))
        elif column is not None and len(cells) > column and line.startswith("| "):
            paths = re.findall(r"`([^`]+)`", cells[column])
            rows[cells[0]] = [p for p in paths if (SRC / p).exists()]
    return rows


def imported_modules(notebook: dict) -> list[str]:
    """The top-level multigpu modules a notebook's code imports (README fallback)."""
    names = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            text = "".join(cell["source"])
            names += re.findall(r"^\s*(?:from|import) multigpu\.(\w+)", text, re.M)
    paths = []
    for name in dict.fromkeys(names):
        if (SRC / name).is_dir():
            paths.append(name + "/")
        elif (SRC / f"{name}.py").exists():
            paths.append(name + ".py")
    return paths


def source_refs(paths: list[str], repo: str) -> str:
    """`ddp/, ranks/ddp.py` as references to the source pages (and to GitHub)."""
    refs = []
    for path in paths:
        ref = f"{{ref}}`{path} <{label(path)}>`"
        link = github_link(repo, path)
        refs.append(f"{ref} ({link})" if link else ref)
    return ", ".join(refs)


def source_page(unit: Path, dest: Path, users: dict[str, list[str]], repo: str) -> str:
    """One page with every .py file of a top-level module, each with its target."""
    top = unit.name + ("/" if unit.is_dir() else "")
    name = "multigpu." + unit.name.removesuffix(".py")
    lines = [f"({label(top)})="] if unit.is_dir() else []
    lines += [f"# `{name}`", ""]
    lines.append(f"The source of `src/multigpu/{top}`. {github_link(repo, top)}")
    if users.get(unit.name):
        lines += ["", "Used by the lessons " + ", ".join(users[unit.name]) + "."]
    files = sorted(unit.rglob("*.py")) if unit.is_dir() else [unit]
    seen_dirs = {unit, unit.parent}
    for path in files:
        if "__pycache__" in path.parts:
            continue
        relative = path.relative_to(SRC).as_posix()
        level = "##"
        if path.parent not in seen_dirs:
            seen_dirs.add(path.parent)
            folder = path.parent.relative_to(SRC).as_posix() + "/"
            lines += ["", f"({label(folder)})=", f"## `{folder}`"]
        if path.parent not in (unit, unit.parent):
            level = "###"
        include = os.path.relpath(path, dest / "source")
        lines += [
            "",
            f"({label(relative)})=",
            f"{level} `{relative}`",
            "",
            "```{literalinclude} " + include,
            ":language: python",
            "```",
        ]
    return "\n".join(lines) + "\n"


def link_sources(notebook: dict, up: str) -> None:
    """Point markdown links to `{up}src/multigpu/X` at X's place on a source page."""

    def ref(match: re.Match) -> str:
        return f"{{ref}}`{match[1].replace('`', '')} <{label(match[2])}>`"

    pattern = re.compile(r"\[([^]]*)\]\(" + re.escape(up) + r"src/multigpu/([^)]+)\)")
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = pattern.sub(ref, "".join(cell["source"]))


def note_cell(text: str) -> dict:
    """A markdown cell (nbformat 4.5) holding `text`."""
    return {"cell_type": "markdown", "id": "site-links", "metadata": {}, "source": text}


def title(notebook: dict, fallback: str) -> str:
    """The notebook's first heading, without its `#`."""
    first = "".join(notebook["cells"][0]["source"]).splitlines()
    heading = next((line for line in first if line.startswith("# ")), "")
    return heading[2:].strip() or fallback


def stage(dest: Path) -> None:
    """Write the whole site source into `dest`."""
    dest = dest.resolve()
    repo = repository_url()
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("conf.py", "favicon.svg"):
        write(dest / name, (ROOT / "book" / name).read_text(encoding="utf-8"))
    mathjax = dest / "_static" / "mathjax"
    if not (mathjax / "MathJax.js").exists():
        import jupyter_server_mathjax

        static = Path(jupyter_server_mathjax.__file__).parent / "static"
        shutil.copytree(static, mathjax, dirs_exist_ok=True)

    modules = readme_modules()
    lessons = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    users: dict[str, list[str]] = {}
    contents = []
    solution_links = []
    for lesson in lessons:
        number = lesson.name.split("_", 1)[0]
        notebook = json.loads(lesson.read_text(encoding="utf-8"))
        solutions = NOTEBOOKS / "solutions" / f"{lesson.stem}_solutions.ipynb"
        paths = modules.get(number) or imported_modules(notebook)
        for path in paths:
            unit = path.split("/", 1)[0]
            link = f"[{number}](../notebooks/{lesson.name})"
            if link not in users.setdefault(unit, []):
                users[unit].append(link)
        note = []
        if solutions.exists():
            note.append(
                f"**Solutions:** [{number} · solutions](solutions/{solutions.name})"
            )
            solution_links.append(
                f"- [{title(notebook, lesson.stem)}](../{lesson.name}): "
                f"[solutions]({solutions.name})"
            )
        if paths:
            note.append(f"**Source** (`src/multigpu/`): {source_refs(paths, repo)}")
        text = ":::{admonition} Solutions and source\n:class: tip\n\n"
        text += "\n\n".join(note) + "\n:::\n"
        if solutions.exists():
            text += f"\n```{{toctree}}\n:hidden:\n\nsolutions/{solutions.stem}\n```\n"
        link_sources(notebook, "../")
        notebook["cells"].insert(1, note_cell(text))
        write(dest / "notebooks" / lesson.name, json.dumps(notebook, indent=1) + "\n")
        contents.append(f"notebooks/{lesson.stem}")
        if solutions.exists():
            answers = json.loads(solutions.read_text(encoding="utf-8"))
            back = (
                f":::{{admonition}} Solutions of a lesson\n:class: tip\n\n"
                f"The exercises are in "
                f"[{title(notebook, lesson.stem)}](../{lesson.name})."
            )
            if paths:
                back += f" Source: {source_refs(paths, repo)}."
            link_sources(answers, "../../")
            answers["cells"].insert(1, note_cell(back + "\n:::"))
            write(
                dest / "notebooks" / "solutions" / solutions.name,
                json.dumps(answers, indent=1) + "\n",
            )
    write(
        dest / "notebooks" / "solutions" / STAGED_INDEX,
        "---\norphan: true\n---\n\n# Solutions\n\n"
        "Every lesson's exercises, solved, executed and checked like the lessons.\n\n"
        + "\n".join(solution_links)
        + "\n",
    )

    docs = sorted((ROOT / "docs").glob("*.md"))
    for doc in docs:
        write(dest / "docs" / doc.name, doc.read_text(encoding="utf-8"))
    pages = []
    for unit in units():
        page = unit.name.removesuffix(".py")
        write(dest / "source" / f"{page}.md", source_page(unit, dest, users, repo))
        pages.append(f"source/{page}")

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    readme = readme.replace(
        "](notebooks/solutions/)", f"](notebooks/solutions/{STAGED_INDEX})"
    )

    def toctree(caption: str, entries: list[str]) -> str:
        body = "\n".join(entries)
        return f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{body}\n```\n"

    index = readme + toctree("Lessons", contents)
    index += toctree("Documentation", [f"docs/{doc.stem}" for doc in docs])
    index += toctree("Package source", pages)
    write(dest / STAGED_INDEX, index)
    # A notebook or doc removed or renamed since the last build leaves no page behind.
    for path in dest.rglob("*"):
        static = path.is_relative_to(dest / "_static")
        if path.is_file() and not static and path not in WRITTEN:
            path.unlink()


if __name__ == "__main__":
    stage(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "site-src")
