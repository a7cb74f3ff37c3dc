"""What a rank function must be (importable by a fresh process), and several of them
run in one launch (07-09b)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from multigpu.runtime.launch.errors import WorkerNotImportableError


def check_importable(worker: Callable[..., Any]) -> None:
    """Raise WorkerNotImportableError unless a fresh process can import ``worker``."""
    if not callable(worker):
        raise TypeError(
            f"spawn needs a function as its worker, got {type(worker).__name__}. "
            "Pass a function defined at the top level of a module."
        )
    module_name = getattr(worker, "__module__", None)
    qualname = getattr(worker, "__qualname__", None) or repr(worker)
    fix = (
        "Move it into a module file (for example src/multigpu/your_module.py), "
        "then import it and pass the imported function."
    )
    if module_name in (None, "__main__", "__mp_main__"):
        raise WorkerNotImportableError(
            f"The worker {qualname!r} is defined in a notebook or script (__main__), "
            f"which the new processes cannot import. {fix}"
        )
    if "<" in qualname:  # "<lambda>" or "<locals>"
        raise WorkerNotImportableError(
            f"The worker {qualname!r} is a lambda or a nested function, which the "
            f"new processes cannot import. {fix}"
        )
    found: Any = None
    try:
        found = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not worker:
        raise WorkerNotImportableError(
            f"The worker {qualname!r} cannot be found as {module_name}.{qualname}, "
            f"so the new processes cannot import it. {fix}"
        )


def check_main_importable() -> None:
    """Raise WorkerNotImportableError when the script that runs this process cannot
    be read again by a new process (07): each rank of spawn re-imports it by its
    file name, and a script read from standard input (``python - <<EOF``) has none.
    """
    import multiprocessing.process

    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return  # python -m module: the ranks import the module by its name
    path = getattr(main, "__file__", None)
    if path is None:
        return  # an interactive Python, python -c, Jupyter: nothing to re-import
    folder = multiprocessing.process.ORIGINAL_DIR or ""
    if os.path.isfile(os.path.join(folder, path)):
        return
    if os.path.basename(path) == "<stdin>":
        raise WorkerNotImportableError(
            "This script was read from standard input (python - <<EOF, or python "
            "< script.py), and the new processes cannot read it again: each rank "
            "re-imports the script that called spawn from its file. Save it to a "
            "file and run python your_script.py (keep its if __name__ == "
            "'__main__': guard)."
        )
    raise WorkerNotImportableError(
        f"The script that called spawn ({path}) no longer exists, so the new "
        "processes cannot re-import it as each rank does. Run it again from its "
        "file."
    )


def in_one_launch(
    rank: int, world_size: int, calls: list[tuple[Callable[..., Any], tuple]]
) -> list[Any]:
    """Run several workers one after the other on the same ranks and return their
    results in order: starting processes costs more than this model's training
    (09, 09b)."""
    return [worker(rank, world_size, *args) for worker, args in calls]
