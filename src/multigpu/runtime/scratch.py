"""Modules a learner writes from a notebook, importable here and by the ranks (07-09).

Ranks import their worker by name, and a notebook is not importable, so an exercise
that asks for a worker, a training step or a torchrun script has the learner write
it as a module. This module keeps such modules in one temporary folder outside the
repository, on ``sys.path`` (for this process and the ranks ``spawn`` starts) and on
``PYTHONPATH`` (for ``torchrun``), and removes it all with :func:`clean_up`.

In a notebook::

    %load_ext multigpu.runtime.scratch

    %%module my_ring
    def ring_all_reduce(tensor): ...

The ``%%module NAME`` cell writes the cell to ``NAME.py`` in the folder and imports
it afresh, so that ``import NAME`` in the next cell gives this version (re-run the
cell after an edit). A
script that must not run on import (a torchrun script joins a process group) is
written with ``%%scratch_file NAME.py`` instead. The outputs name the file, never
the temporary path, so stored outputs are the same on every machine. Outside
IPython, :func:`write_module` and :func:`write_file` do the same.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

__all__ = [
    "clean_up",
    "folder",
    "load_ipython_extension",
    "write_file",
    "write_module",
]

_folder: Path | None = None
_written: set[str] = set()  # module names written into the folder


def folder() -> Path:
    """The scratch folder, made and put on sys.path and PYTHONPATH on first use."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="multigpu_scratch_"))
        sys.path.insert(0, str(_folder))
        paths = [str(_folder), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return _folder


def write_file(filename: str, text: str) -> Path:
    """Write ``text`` to ``filename`` in the scratch folder; return its path."""
    if Path(filename).name != filename:
        raise ValueError(
            f"{filename!r} is not a plain file name. Give a name without folders, "
            "e.g. my_ddp.py: it goes into the scratch folder."
        )
    path = folder() / filename
    path.write_text(text, encoding="utf-8")
    if path.suffix == ".py":
        # Python trusts a module's cached compile (__pycache__) while the source has
        # the same size and modification time in whole seconds: an edit of the same
        # size within a second (VALUE = 1 -> VALUE = 2) would import the old code.
        Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)
    return path


def write_module(name: str, source: str) -> ModuleType:
    """Write ``source`` to ``NAME.py`` in the scratch folder and import it afresh."""
    if not name.isidentifier():
        raise ValueError(
            f"{name!r} is not a valid module name. Use letters, digits and "
            "underscores, not starting with a digit, e.g. my_ring."
        )
    write_file(f"{name}.py", source)
    _written.add(name)
    importlib.invalidate_caches()  # the file is new or changed: look again
    sys.modules.pop(name, None)  # so the import runs the new code
    return importlib.import_module(name)


def clean_up() -> None:
    """Forget the written modules, take the folder off the paths and delete it."""
    global _folder
    for name in _written:
        sys.modules.pop(name, None)
    _written.clear()
    if _folder is None:
        return
    if str(_folder) in sys.path:
        sys.path.remove(str(_folder))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    kept = [p for p in paths if p and p != str(_folder)]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("PYTHONPATH", None)
    shutil.rmtree(_folder, ignore_errors=True)
    _folder = None


atexit.register(clean_up)  # a kernel that ends without the last cell leaves nothing


def load_ipython_extension(ipython) -> None:
    """``%load_ext multigpu.runtime.scratch``: adds the ``%%module NAME`` and
    ``%%scratch_file NAME`` cell magics."""

    def module(line: str, cell: str) -> None:
        name = line.strip()
        write_module(name, cell)  # imported now: an error shows in this cell
        print(f"wrote {name}.py; `import {name}` gives this version")

    def scratch_file(line: str, cell: str) -> None:
        name = line.strip()
        write_file(name, cell)
        print(f"wrote {name}")

    ipython.register_magic_function(module, magic_kind="cell", magic_name="module")
    ipython.register_magic_function(
        scratch_file, magic_kind="cell", magic_name="scratch_file"
    )
