"""The folders JupyterLab writes: a home that cannot hold them, simulated with a
HOME below a file, then the printed fix applied."""

import shlex

import pytest

from multigpu.doctor.lab_folders import (
    SUBFOLDERS,
    check_lab_folders,
    lab_folders,
    write_error,
)
from multigpu.doctor.result import FAIL, OK

VARIABLES = ("JUPYTER_CONFIG_DIR", "JUPYTER_PLATFORM_DIRS", "JUPYTER_NO_CONFIG")


@pytest.fixture
def unusable_home(tmp_path, monkeypatch):
    """HOME lies below a file, so nothing can be created in it (a read-only home
    has the same effect; as root, permissions cannot simulate it)."""
    (tmp_path / "file").write_text("")
    home = tmp_path / "file" / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in (*VARIABLES, *SUBFOLDERS):
        monkeypatch.delenv(name, raising=False)
    return home


def test_a_home_jupyterlab_cannot_write_in_fails_and_the_printed_fix_works(
    unusable_home, tmp_path, monkeypatch
):
    from jupyter_core.application import JupyterApp

    with pytest.raises(NotADirectoryError):  # what `jupyter lab` stops with
        print(JupyterApp().runtime_dir)
    spare = tmp_path / "spare"
    result = check_lab_folders(spare=lambda: spare, platform="linux")
    assert result.status == FAIL
    assert result.measured == (
        f"JupyterLab cannot write its data files ({unusable_home}/.local/share/"
        f"jupyter), runtime files ({unusable_home}/.local/share/jupyter/runtime), "
        f"settings ({unusable_home}/.jupyter/lab/user-settings), workspaces "
        f"({unusable_home}/.jupyter/lab/workspaces): {tmp_path}/file is a file, not "
        "a folder"
    )
    export = result.fix.split("`")[1]
    assert result.fix == (
        f"`{export}` in the terminal before `make lab` (add it to your shell profile)"
    )
    words = shlex.split(export)
    assert words[0] == "export"
    for name, value in (word.split("=", 1) for word in words[1:]):
        monkeypatch.setenv(name, value)
    assert check_lab_folders().status == OK
    assert JupyterApp().runtime_dir == str(spare / "runtime")
    assert (spare / "runtime").is_dir()


def test_the_folders_are_where_jupyterlab_puts_them(tmp_path, monkeypatch):
    from jupyterlab.commands import get_user_settings_dir, get_workspaces_dir

    for moved in (False, True):
        if moved:
            monkeypatch.setenv("JUPYTERLAB_SETTINGS_DIR", str(tmp_path / "s"))
            monkeypatch.setenv("JUPYTERLAB_WORKSPACES_DIR", str(tmp_path / "w"))
        folders = {name: where for _, where, name in lab_folders()}
        assert folders["JUPYTERLAB_SETTINGS_DIR"] == get_user_settings_dir()
        assert folders["JUPYTERLAB_WORKSPACES_DIR"] == get_workspaces_dir()
    assert check_lab_folders().status == OK  # this machine's


def test_only_the_folder_that_cannot_be_written_is_moved(tmp_path):
    def probe(folder):
        return "Permission denied" if folder.endswith("runtime") else None

    result = check_lab_folders(probe=probe, spare=lambda: tmp_path, platform="linux")
    assert result.status == FAIL
    assert result.measured.startswith("JupyterLab cannot write its runtime files (")
    assert result.measured.endswith("): Permission denied")
    assert result.fix.startswith(f"`export JUPYTER_RUNTIME_DIR={tmp_path}/runtime` ")


def test_writing_is_tried_for_real_and_leaves_nothing(tmp_path):
    assert write_error(str(tmp_path / "new" / "deeper")) is None
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    assert write_error(str(tmp_path / "file" / "x")) == (
        f"{tmp_path}/file is a file, not a folder"
    )
