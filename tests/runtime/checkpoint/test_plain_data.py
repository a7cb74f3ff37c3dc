"""Plain data for weights-only loading: dataclasses stored as their fields, and
what save refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from multigpu.core.train import History, TrainConfig
from multigpu.runtime.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from tests.runtime.checkpoint.helpers import Opaque, small_model

# --- plain data: what weights-only loading accepts ----------------------------------


@dataclasses.dataclass(frozen=True)
class OwnSettings:
    """A dataclass of a module outside the package (this test file)."""

    name: str = "run"
    sizes: tuple[int, ...] = (1, 2)


def test_a_config_round_trips_through_weights_only_loading(tmp_path):
    config = TrainConfig(epochs=2, lr=0.1, seed=3)
    history = History(train_loss=[1.5, 0.5], parameters={"w": torch.ones(2)})
    extras = {
        "step": 120,
        "loss": 0.25,
        "note": "hello",
        "flag": True,
        "nothing": None,
        "seeds": [0, 1],
        "shape": (3, 4),
        "nested": {"lr": 0.1, "sizes": [64, 128], "configs": [config]},
    }
    path = save_checkpoint(
        tmp_path / "c.pt",
        small_model(),
        epoch=4,
        config=config,
        history=history,
        **extras,
    )
    raw = torch.load(path, weights_only=True)  # plain torch.load reads it too
    assert raw["config"] == {
        "__dataclass__": "multigpu.core.train.TrainConfig",
        "fields": dataclasses.asdict(config),
    }
    loaded = load_checkpoint(path, small_model(1))
    assert type(loaded["config"]) is TrainConfig and loaded["config"] == config
    assert type(loaded["history"]) is History
    assert loaded["history"].train_loss == [1.5, 0.5]
    torch.testing.assert_close(loaded["history"].parameters["w"], torch.ones(2))
    assert {key: loaded[key] for key in extras} == extras
    assert type(loaded["shape"]) is tuple
    assert loaded["nested"]["configs"][0] == config
    assert loaded["epoch"] == 4


def test_a_dataclass_of_another_module_comes_back_as_its_fields(tmp_path):
    save_checkpoint(tmp_path / "c.pt", small_model(), settings=OwnSettings())
    loaded = load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert loaded["settings"] == {"name": "run", "sizes": (1, 2)}
    assert OwnSettings(**loaded["settings"]) == OwnSettings()


def test_a_file_naming_other_code_imports_and_runs_nothing(tmp_path):
    state = small_model().state_dict()
    stored = {"__dataclass__": "subprocess.Popen", "fields": {"args": ["false"]}}
    torch.save(
        {"model": state, "optimizer": None, "epoch": None, "x": stored},
        tmp_path / "c.pt",
    )
    with pytest.warns(UserWarning, match="holds no checksum"):  # torch.save's file
        loaded = load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert loaded["x"] == {"args": ["false"]}  # the fields, no process


def test_a_stored_config_that_no_longer_fits_is_a_clear_error(tmp_path):
    stored = {
        "__dataclass__": "multigpu.core.train.TrainConfig",
        "fields": {"epochs": 1, "colour": "red"},
    }
    torch.save(
        {"model": small_model().state_dict(), "epoch": None, "config": stored},
        tmp_path / "c.pt",
    )
    with (
        pytest.raises(CheckpointError) as error,
        pytest.warns(UserWarning, match="holds no checksum"),  # torch.save's file
    ):
        load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert str(error.value) == (
        "c.pt stores a multigpu.core.train.TrainConfig that this version of multigpu "
        "cannot build again from its fields (TypeError: TrainConfig.__init__() got "
        "an unexpected keyword argument 'colour'). Load it with the version of "
        "multigpu that saved it, or read its fields with torch.load and build the "
        "TrainConfig yourself."
    )


@pytest.mark.parametrize(
    "value, refused",
    [
        (Opaque(), f"{Opaque.__module__}.Opaque"),
        ({"inner": [Path("data")]}, f"pathlib.{type(Path()).__name__}"),
        (lambda: 1, "function"),
    ],
    ids=["own class", "nested Path", "lambda"],
)
def test_save_refuses_what_loading_would_refuse(tmp_path, value, refused):
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=1)
    with pytest.raises(TypeError) as error:
        save_checkpoint(tmp_path / "c.pt", small_model(1), epoch=2, thing=value)
    assert str(error.value) == (
        f"save_checkpoint cannot store 'thing': it holds a {refused}, and "
        "load_checkpoint unpickles only plain data, so that loading a file runs no "
        "code from it. Pass plain data instead: tensors, numbers, strings, lists, "
        "tuples, dicts and dataclasses of them (for a Path, str(path))."
    )
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # nothing written
    assert load_checkpoint(tmp_path / "c.pt", small_model())["epoch"] == 1


def test_save_keeps_its_own_keys(tmp_path):
    with pytest.raises(ValueError) as error:
        save_checkpoint(tmp_path / "c.pt", small_model(), optimizer_type="SGD")
    assert str(error.value) == (
        "save_checkpoint keeps the key(s) ['optimizer_type'] for itself, so they "
        "cannot be passed as extra values. Store the value under another name."
    )


def test_a_state_dict_stored_as_an_extra_keeps_its_metadata(tmp_path):
    ema = small_model(seed=2).state_dict()
    save_checkpoint(tmp_path / "c.pt", small_model(), ema=ema, config=TrainConfig())
    loaded = load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert loaded["ema"]._metadata == ema._metadata
    small_model().load_state_dict(loaded["ema"])
