"""``make lab`` opens JupyterLab without asking about Jupyter news.

The Makefile copies etc/jupyterlab-overrides.json into .venv's JupyterLab settings
(``overrides.d``, never the user's home); JupyterLab then takes its values as the
defaults of the notification plugin, so a workshop's first notebook opens without
the "notified about official Jupyter news?" prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyterlab.commands import get_app_dir
from jupyterlab_server.settings_utils import get_settings

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ROOT / "etc" / "jupyterlab-overrides.json"
PLUGIN = "@jupyterlab/apputils-extension:notification"


def defaults(app_settings_dir: Path, user_dir: Path) -> dict:
    app = Path(get_app_dir())
    result, _ = get_settings(
        str(app_settings_dir), str(app / "schemas"), str(user_dir), PLUGIN
    )
    return {
        name: spec.get("default")
        for name, spec in result["schema"]["properties"].items()
    }


def test_the_overrides_name_real_settings():
    app = Path(get_app_dir())
    for plugin, values in json.loads(OVERRIDES.read_text()).items():
        package, name = plugin.split(":")
        schema = json.loads((app / "schemas" / package / f"{name}.json").read_text())
        assert set(values) <= set(schema["properties"]), plugin


def test_jupyterlab_in_the_venv_never_asks_about_news(tmp_path):
    installed = Path(get_app_dir()) / "settings" / "overrides.d" / "multigpu.json"
    if not installed.exists():
        pytest.fail(f"run `make setup`: {installed.name} is not installed")
    assert installed.read_text() == OVERRIDES.read_text()
    found = defaults(Path(get_app_dir()) / "settings", tmp_path)
    assert found["fetchNews"] == "false"
    assert found["checkForUpdates"] is False


def test_without_the_overrides_jupyterlab_would_ask(tmp_path):
    (tmp_path / "settings").mkdir()
    (tmp_path / "user").mkdir()
    found = defaults(tmp_path / "settings", tmp_path / "user")
    assert found["fetchNews"] == "none"  # "Ask": the prompt
