"""The folders JupyterLab writes in the user's home: its data and runtime files
(without them ``jupyter lab`` stops as it starts, or its extensions fail), the user
settings and the workspaces."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from multigpu.doctor.network import export_command
from multigpu.doctor.result import CheckResult, fail, ok

# Where the fix moves the folders that cannot be written: inside this environment,
# which pip could write (a folder of it that `rm -rf .venv` removes too), one
# subfolder per variable.
SPARE = "jupyter-user"
SUBFOLDERS = {
    "JUPYTER_DATA_DIR": "data",
    "JUPYTER_RUNTIME_DIR": "runtime",
    "JUPYTERLAB_SETTINGS_DIR": "user-settings",
    "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
}


def lab_folders() -> list[tuple[str, str, str]]:
    """``(what, folder, variable)`` for each folder JupyterLab writes, as
    jupyter_core.paths and jupyterlab.commands find it: the data files
    (``JUPYTER_DATA_DIR``), the runtime files (``JUPYTER_RUNTIME_DIR``), the
    settings (``JUPYTERLAB_SETTINGS_DIR``) and the workspaces
    (``JUPYTERLAB_WORKSPACES_DIR``); ``variable`` moves the folder."""
    from jupyter_core.paths import (
        jupyter_config_dir,
        jupyter_data_dir,
        jupyter_runtime_dir,
    )

    lab = Path(jupyter_config_dir(), "lab")
    settings = os.environ.get("JUPYTERLAB_SETTINGS_DIR") or str(lab / "user-settings")
    workspaces = os.environ.get("JUPYTERLAB_WORKSPACES_DIR") or str(lab / "workspaces")
    return [
        ("data files", jupyter_data_dir(), "JUPYTER_DATA_DIR"),
        ("runtime files", jupyter_runtime_dir(), "JUPYTER_RUNTIME_DIR"),
        ("settings", os.path.abspath(settings), "JUPYTERLAB_SETTINGS_DIR"),
        ("workspaces", os.path.abspath(workspaces), "JUPYTERLAB_WORKSPACES_DIR"),
    ]


def write_error(folder: str) -> str | None:
    """Why ``folder`` cannot be created or written (tried for real: a folder made
    and removed in it, or in its nearest existing parent); None if it can."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        probe = tempfile.mkdtemp(prefix=".multigpu-doctor-", dir=existing)
    except OSError as exc:
        return f"cannot create anything in {existing}: {exc.strerror or exc}"
    os.rmdir(probe)
    return None


def spare_folder() -> Path:
    """A folder JupyterLab can use instead: in this environment where it can be
    written, else in the temporary folder."""
    inside = Path(sys.prefix, SPARE)
    if write_error(str(inside)) is None:
        return inside
    return Path(tempfile.gettempdir(), f"multigpu-{SPARE}")


def check_lab_folders(
    folders: Callable[[], list[tuple[str, str, str]]] = lab_folders,
    probe: Callable[[str], str | None] = write_error,
    spare: Callable[[], Path] = spare_folder,
    platform: str = sys.platform,
) -> CheckResult:
    """JupyterLab can write its runtime files, settings and workspaces (a home
    folder that is read-only or not one's own stops ``jupyter lab``)."""
    found = folders()
    failed = [(what, where, name, probe(where)) for what, where, name in found]
    failed = [entry for entry in failed if entry[3] is not None]
    if not failed:
        return ok(
            "Jupyter folders",
            f"JupyterLab can write its {', '.join(what for what, _, _ in found)} "
            f"({found[0][1]}, ...)",
        )
    place = spare()
    moved = {name: str(place / SUBFOLDERS[name]) for _, _, name, _ in failed}
    by_error: dict[str, list[str]] = {}
    for what, where, _, error in failed:
        by_error.setdefault(error, []).append(f"{what} ({where})")
    return fail(
        "Jupyter folders",
        "; ".join(
            f"JupyterLab cannot write its {', '.join(folders)}: {error}"
            for error, folders in by_error.items()
        ),
        f"`{export_command(moved, platform)}` in the terminal before `make lab` "
        "(add it to your shell profile)",
    )
