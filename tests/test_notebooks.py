"""Stored notebook metadata matches the kernel that ``make lab`` starts.

When JupyterLab opens a notebook it writes the running kernel's ``kernelspec``
(name, display name, language) and ``language_info`` into the notebook's metadata.
If the stored values differ, the notebook is marked modified without anything being
run, autosave rewrites the committed file, and a later ``git pull`` fails. These
tests fail when a notebook stores anything else. ``make notebooks`` rewrites the
metadata with this file's ``--fix`` (``python tests/test_notebooks.py --fix``).

The Python version inside ``language_info`` is the interpreter's own, so it is
compared only between notebooks (all the same), not with the interpreter running
the tests: on another Python version, opening a notebook changes that one value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ipykernel.ipkernel import IPythonKernel
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(
    ROOT.glob("notebooks/solutions/*.ipynb")
)
KERNEL = "python3"  # the kernel ipykernel installs, which `make lab` starts


def expected_metadata() -> dict:
    """The kernelspec and language_info that JupyterLab writes for this kernel."""
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    return {
        "kernelspec": {
            "display_name": spec.display_name,
            "language": spec.language,
            "name": KERNEL,
        },
        "language_info": dict(IPythonKernel.language_info),
    }


def _without_version(language_info: dict) -> dict:
    return {key: value for key, value in language_info.items() if key != "version"}


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 18


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_metadata_is_what_the_kernel_reports(path):
    stored = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    expected = expected_metadata()
    assert stored.get("kernelspec") == expected["kernelspec"], (
        f"{path.name}: run `make notebooks` (or python tests/test_notebooks.py --fix)"
    )
    assert _without_version(stored.get("language_info", {})) == _without_version(
        expected["language_info"]
    )


def test_every_notebook_stores_the_same_python_version():
    versions = {
        json.loads(path.read_text(encoding="utf-8"))["metadata"]["language_info"][
            "version"
        ]
        for path in NOTEBOOKS
    }
    assert len(versions) == 1, versions


def fix() -> None:
    """Write the expected metadata into every notebook (``make notebooks`` calls it)."""
    import nbformat

    expected = expected_metadata()
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        if any(notebook.metadata.get(key) != value for key, value in expected.items()):
            notebook.metadata.update(expected)
            nbformat.write(notebook, path)
            print(f"metadata fixed: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--fix"]:
        sys.exit("usage: python tests/test_notebooks.py --fix")
    fix()
