"""Saving and loading in every direction, map_location, and clear errors for
damaged files and mismatched optimizers."""

from __future__ import annotations

import copy
import os
import pickle
import random
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

from multigpu.core.devices import simulated_devices
from multigpu.runtime.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    InvalidCheckpointError,
    OptimizerMismatchError,
    UnsafeCheckpointError,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
)
from tests.runtime.checkpoint.helpers import Opaque, assert_same_state, small_model

# --- save and load ------------------------------------------------------------------


@pytest.mark.parametrize("save_wrapped", [False, True])
@pytest.mark.parametrize("load_wrapped", [False, True])
def test_save_load_in_every_direction(tmp_path, save_wrapped, load_wrapped):
    source, target = small_model(seed=0), small_model(seed=1)
    path = save_checkpoint(
        tmp_path / "ckpt.pt",
        nn.DataParallel(source) if save_wrapped else source,
        epoch=3,
        note="hello",
    )
    saved = torch.load(path, weights_only=True)
    assert list(saved["model"]) == list(source.state_dict())  # never prefixed
    loaded = load_checkpoint(path, nn.DataParallel(target) if load_wrapped else target)
    assert (loaded["epoch"], loaded["note"], loaded["optimizer"]) == (3, "hello", None)
    assert_same_state(source, target)


@pytest.mark.parametrize("wrapped_file", [False, True])
def test_load_bare_state_dict_files(tmp_path, wrapped_file):
    source, target = small_model(seed=0), small_model(seed=1)
    saver = nn.DataParallel(source) if wrapped_file else source
    torch.save(saver.state_dict(), tmp_path / "bare.pt")  # the usual one-liner
    loaded = load_checkpoint(tmp_path / "bare.pt", target)
    assert loaded["epoch"] is None
    assert_same_state(source, target)


def test_optimizer_state_round_trip_continues_training_identically(tmp_path):
    torch.manual_seed(0)
    X, y = torch.randn(8, 4), torch.randn(8, 2)

    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(X), y).backward()
        optimizer.step()

    # train on a wrapped model, save, continue on a plain copy
    wrapped = nn.DataParallel(small_model(seed=0))
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    step(wrapped, optimizer)
    save_checkpoint(tmp_path / "c.pt", wrapped, optimizer, epoch=1)
    resumed = small_model(seed=5)
    resumed_optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    assert load_checkpoint(tmp_path / "c.pt", resumed, resumed_optimizer)["epoch"] == 1
    step(wrapped, optimizer)
    step(resumed, resumed_optimizer)
    assert_same_state(wrapped, resumed)


def test_named_optimizer_keeps_prefixed_names_but_loads_by_position(tmp_path):
    # notebook 06: param_names carry "module.", load_state_dict ignores them
    torch.manual_seed(0)
    X, y = torch.randn(8, 4), torch.randn(8, 2)
    wrapped = nn.DataParallel(small_model(seed=0))
    optimizer = torch.optim.SGD(wrapped.named_parameters(), lr=0.1, momentum=0.9)
    optimizer.zero_grad()
    nn.functional.mse_loss(wrapped(X), y).backward()
    optimizer.step()
    names = optimizer.state_dict()["param_groups"][0]["param_names"]
    assert names[0] == "module.0.weight"
    save_checkpoint(tmp_path / "c.pt", wrapped, optimizer)
    resumed = small_model(seed=5)
    resumed_optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    load_checkpoint(tmp_path / "c.pt", resumed, resumed_optimizer)
    assert resumed_optimizer.param_groups[0]["param_names"] == names  # copied over
    for before, after in zip(
        optimizer.param_groups[0]["params"],
        resumed_optimizer.param_groups[0]["params"],
        strict=True,
    ):
        torch.testing.assert_close(
            optimizer.state[before]["momentum_buffer"],
            resumed_optimizer.state[after]["momentum_buffer"],
        )


def test_mismatch_error_lists_keys_and_the_fix(tmp_path):
    save_checkpoint(tmp_path / "c.pt", nn.DataParallel(small_model()))
    other = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Linear(2, 1))
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(tmp_path / "c.pt", other)
    message = str(error.value)
    assert message.startswith("c.pt does not fit Sequential:")
    assert "missing key(s) ['3.weight', '3.bias']" in message
    assert "unexpected key(s) ['1.weight', '1.bias', '1.running_mean'" in message
    assert "strict=False" in message and "same class and arguments" in message
    assert str(tmp_path) not in message  # a file name, never a machine path


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("wrapped", [False, True])
def test_a_model_of_another_shape_is_left_as_it_was(tmp_path, strict, wrapped):
    """Issue 30: torch copied the tensors that fit ('2.bias') before it raised a
    multi-line "size mismatch" RuntimeError, with strict=False too."""
    save_checkpoint(tmp_path / "c.pt", small_model(seed=0))
    torch.manual_seed(1)
    wider = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
    wider[1].running_mean.fill_(0.5)  # buffers must stay as they were too
    before = copy.deepcopy(wider.state_dict())
    model = nn.DataParallel(wider) if wrapped else wider
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(tmp_path / "c.pt", model, strict=strict)
    assert str(error.value) == (
        "c.pt does not fit Sequential: '0.weight' has shape [3, 4] in c.pt but "
        "shape [5, 4] in the model (and 6 more tensor(s) differ); nothing was "
        "loaded. Build the model with the same class and arguments as the one "
        "that was saved."
    )
    after = wider.state_dict()
    assert list(after) == list(before)
    for key in before:  # '2.bias' (shape [2] in both) included
        assert torch.equal(after[key], before[key]), key


def test_a_value_that_is_no_tensor_is_refused_before_loading():
    model = small_model(seed=1)
    state = {**small_model(seed=0).state_dict(), "1.running_var": [1.0, 1.0, 1.0]}
    with pytest.raises(CheckpointMismatchError, match="'1.running_var' is a list in"):
        load_model_state(model, state)
    assert_same_state(model, small_model(seed=1))
    # what torch accepts still loads: a scalar saved with shape [1] (PyTorch 0.3)
    state = {**small_model(seed=0).state_dict(), "1.num_batches_tracked": [7]}
    state["1.num_batches_tracked"] = torch.tensor(state["1.num_batches_tracked"])
    load_model_state(model, state)
    assert model[1].num_batches_tracked.item() == 7


def test_non_strict_load_fills_what_matches():
    source = small_model(seed=0)
    other = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Linear(2, 1))
    missing, unexpected = load_model_state(
        other, nn.DataParallel(source).state_dict(), strict=False
    )
    assert missing == ["3.weight", "3.bias"]
    assert "1.running_mean" in unexpected
    torch.testing.assert_close(other[0].weight, source[0].weight)
    torch.testing.assert_close(other[2].weight, source[2].weight)


def test_missing_optimizer_state_is_a_clear_error(tmp_path):
    model = small_model()
    save_checkpoint(tmp_path / "c.pt", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "c.pt", model, optimizer)


def test_extras_round_trip_with_weights_only_loading(tmp_path):
    extras = {"step": 120, "config": {"lr": 0.1, "batch_size": 64}, "seeds": [0, 1]}
    save_checkpoint(tmp_path / "c.pt", small_model(), epoch=4, **extras)
    loaded = load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert {key: loaded[key] for key in extras} == extras


def test_a_file_that_is_not_a_checkpoint(tmp_path):
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(TypeError, match="not a checkpoint dict"):
        load_checkpoint(tmp_path / "tensor.pt", small_model())


@contextmanager
def saved_as_if_on(location: str):
    """Within the block, torch.save records every CPU tensor as stored on
    ``location`` (e.g. "cuda:99"), as a checkpoint written on a GPU machine would."""
    registry = list(torch.serialization._package_registry)
    torch.serialization.register_package(
        1,  # asked before PyTorch's own taggers (priority 10 and up)
        lambda storage: location if storage.device.type == "cpu" else None,
        lambda storage, saved_location: None,  # loading is left to PyTorch
    )
    try:
        yield
    finally:
        torch.serialization._package_registry[:] = registry


@pytest.fixture
def gpu_checkpoint(tmp_path):
    """A checkpoint whose tensors were saved on "cuda:99", a GPU no machine has."""
    source = small_model(seed=0)
    with saved_as_if_on("cuda:99"):
        save_checkpoint(tmp_path / "c.pt", source, epoch=1)
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on"):
        torch.load(tmp_path / "c.pt", weights_only=True)  # PyTorch's own default
    return tmp_path / "c.pt", source


@pytest.mark.parametrize(
    "map_location",
    [None, "cpu", torch.device("cpu"), simulated_devices(2)[1], "gpu:1", " GPU:1"],
    ids=["default", "str", "torch.device", "simulated", "simulated name", "spaced"],
)
def test_map_location_moves_a_gpu_checkpoint_to_the_cpu(gpu_checkpoint, map_location):
    path, source = gpu_checkpoint
    target = small_model(seed=1)
    if map_location is None:  # the default of load_checkpoint is the CPU
        loaded = load_checkpoint(path, target)
    else:
        loaded = load_checkpoint(path, target, map_location=map_location)
    assert {tensor.device for tensor in loaded["model"].values()} == {
        torch.device("cpu")
    }
    assert loaded["epoch"] == 1
    assert_same_state(source, target)


@pytest.mark.gpu(1)
def test_map_location_moves_a_cpu_checkpoint_to_a_gpu(tmp_path):
    source = small_model(seed=0)
    save_checkpoint(tmp_path / "c.pt", source)
    loaded = load_checkpoint(tmp_path / "c.pt", small_model(1), map_location="cuda:0")
    assert {tensor.device for tensor in loaded["model"].values()} == {
        torch.device("cuda", 0)
    }
    for key, value in source.state_dict().items():
        torch.testing.assert_close(loaded["model"][key].cpu(), value, rtol=0, atol=0)


def test_save_creates_parent_directories(tmp_path):
    path = save_checkpoint(tmp_path / "runs" / "a" / "c.pt", small_model(), epoch=0)
    assert path.is_file()


# --- map_location: simulated device names and bad names ----------------------------


def test_simulated_name_moves_nothing_off_the_cpu(tmp_path):
    # PyTorch itself does not know the simulated names
    torch.save(small_model().state_dict(), tmp_path / "c.pt")
    with pytest.raises(RuntimeError, match=r"tagged with gpu:1"):
        torch.load(tmp_path / "c.pt", map_location="gpu:1", weights_only=True)
    target = small_model(seed=1)
    loaded = load_checkpoint(tmp_path / "c.pt", target, map_location="gpu:1")
    assert {tensor.device for tensor in loaded["model"].values()} == {
        torch.device("cpu")
    }
    assert_same_state(small_model(), target)


def test_bad_device_names_are_refused_before_the_file_is_read(tmp_path):
    save_checkpoint(tmp_path / "c.pt", small_model())
    with pytest.raises(ValueError, match=r"^Unknown device 'gpu:x'\."):
        load_checkpoint(tmp_path / "c.pt", small_model(), map_location="gpu:x")
    with pytest.raises(ValueError) as error:
        load_checkpoint(tmp_path / "c.pt", small_model(), map_location="banana")
    assert str(error.value) == (
        "Unknown map_location 'banana'. Use 'cpu', 'cuda:N', a simulated 'gpu:N', "
        "a torch.device or a Device."
    )


def test_a_device_this_machine_lacks_is_not_called_a_damaged_file(gpu_checkpoint):
    path, _ = gpu_checkpoint
    if torch.cuda.device_count() > 99:
        pytest.skip("this machine has a cuda:99")
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on") as e:
        load_checkpoint(path, small_model(), map_location=None)  # keep saved devices
    assert not isinstance(e.value, CheckpointError)


# --- files that are not checkpoints -------------------------------------------------


def damaged_files(directory: Path) -> dict[str, bytes]:
    """Bytes that torch.load cannot read, and the errors it raises on its own."""
    save_checkpoint(directory / "good.pt", nn.Linear(30, 30), epoch=1)
    good = (directory / "good.pt").read_bytes()  # 5.6 kB
    return {
        "empty": b"",
        "truncated": good[: len(good) - 100],  # cut short: OSError [Errno 22]
        "half": good[: len(good) // 2],  # RuntimeError from the zip reader
        "random bytes": random.Random(0).randbytes(1000),
        "text": b"hello world\n",
    }


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("kind", ["empty", "truncated", "half", "random bytes", "text"])
def test_a_damaged_file_says_it_is_not_a_valid_checkpoint(tmp_path, kind, weights_only):
    path = tmp_path / "c.pt"
    path.write_bytes(damaged_files(tmp_path)[kind])
    with pytest.raises(Exception) as raw:  # what torch.load says on its own
        torch.load(path, weights_only=weights_only)
    with pytest.raises(InvalidCheckpointError) as error:
        load_checkpoint(path, small_model(), weights_only=weights_only)
    message = str(error.value)
    if kind == "empty":
        assert message == (
            "c.pt is not a valid checkpoint: the file is empty (0 bytes). Restore "
            "c.pt from a copy, or save the checkpoint again with save_checkpoint."
        )
    else:
        assert message == (
            "c.pt is not a valid checkpoint: torch.load cannot read it "
            f"({type(raw.value).__name__}), so it is cut short, corrupted, or not a "
            "file written by torch.save. Restore c.pt from a copy, or save the "
            "checkpoint again with save_checkpoint."
        )
    assert isinstance(error.value, CheckpointError | RuntimeError)
    assert error.value.__cause__ is not None  # torch's own error, for the curious
    shown = "".join(traceback.format_exception(error.value))
    assert "weights_only=False" not in shown  # never advice to load unsafely
    assert str(tmp_path) not in message


def test_torch_alone_gives_the_unclear_errors(tmp_path):
    """What the issue saw: each damage gets a different, unhelpful error."""
    files = damaged_files(tmp_path)
    for kind, error_type, text in [
        ("empty", EOFError, ""),
        ("truncated", OSError, "[Errno 22] Invalid argument"),
        ("random bytes", Exception, "weights_only` set to `False"),
    ]:
        (tmp_path / "c.pt").write_bytes(files[kind])
        with pytest.raises(error_type) as error:
            torch.load(tmp_path / "c.pt", weights_only=True)
        assert text in str(error.value)


def test_a_file_holding_other_objects_is_refused_without_unsafe_advice(tmp_path):
    state = small_model().state_dict()
    torch.save({"model": state, "epoch": 1, "thing": Opaque()}, tmp_path / "c.pt")
    refused = f"{Opaque.__module__}.Opaque"
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert str(error.value) == (
        f"c.pt holds a {refused}, which load_checkpoint does not unpickle because "
        "unpickling objects other than plain data can run code from the file. Save "
        "the checkpoint again with save_checkpoint, which stores plain data, or, "
        "only if you trust where the file came from, load it inside "
        f"`with torch.serialization.safe_globals([{refused}]):`."
    )
    assert "weights_only=False" not in "".join(traceback.format_exception(error.value))
    unchecked = pytest.warns(UserWarning, match="holds no checksum")  # torch.save's
    with torch.serialization.safe_globals([Opaque]), unchecked:  # the advice works
        assert isinstance(
            load_checkpoint(tmp_path / "c.pt", small_model(1))["thing"], Opaque
        )
    # an explicit opt-in to full unpickling loads it too
    with pytest.warns(UserWarning, match="holds no checksum"):
        loaded = load_checkpoint(tmp_path / "c.pt", small_model(1), weights_only=False)
    assert isinstance(loaded["thing"], Opaque)


class RunsACommand:
    """Pickles as a call to os.system (posix.system): a malicious checkpoint."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.skipif(os.name != "posix", reason="os.system is posix.system on POSIX")
def test_a_file_that_would_run_a_command_is_called_unsafe(tmp_path):
    marker = tmp_path / "ran"
    payload = RunsACommand(f"touch {marker}")
    state = small_model().state_dict()
    torch.save({"model": state, "epoch": 1, "x": payload}, tmp_path / "c.pt")
    with pytest.raises(pickle.UnpicklingError, match="whose module posix is blocked"):
        torch.load(tmp_path / "c.pt", weights_only=True)  # torch's own wording
    with pytest.raises(UnsafeCheckpointError) as error:
        load_checkpoint(tmp_path / "c.pt", small_model(1))
    assert str(error.value) == (
        "c.pt holds a posix.system, from the module posix, which PyTorch never "
        "unpickles because it can run commands on this machine: the file was not "
        "written by save_checkpoint and may be malicious. Do not load c.pt; save "
        "the checkpoint again with save_checkpoint."
    )
    assert "weights_only=False" not in "".join(traceback.format_exception(error.value))
    assert not marker.exists()  # nothing ran


# --- optimizers of another type ---------------------------------------------------


def trained_optimizer(model: nn.Module, kind: type, **options) -> torch.optim.Optimizer:
    """An optimizer of type ``kind`` after one step, so that it has state."""
    optimizer = kind(model.parameters(), lr=0.1, **options)
    torch.manual_seed(0)
    nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 2)).backward()
    optimizer.step()
    return optimizer


def test_torch_alone_says_key_error_step():
    model = small_model()
    sgd_state = trained_optimizer(model, torch.optim.SGD, momentum=0.9).state_dict()
    with pytest.raises(KeyError, match="'step'"):
        torch.optim.Adam(model.parameters()).load_state_dict(sgd_state)


def test_the_optimizer_type_is_saved(tmp_path):
    model = small_model()
    save_checkpoint(
        tmp_path / "c.pt", model, trained_optimizer(model, torch.optim.Adam)
    )
    assert torch.load(tmp_path / "c.pt", weights_only=True)["optimizer_type"] == "Adam"
    save_checkpoint(tmp_path / "plain.pt", model)  # the keys notebook 06 shows
    assert list(torch.load(tmp_path / "plain.pt", weights_only=True)) == [
        "model",
        "optimizer",
        "epoch",
    ]


@pytest.mark.parametrize(
    "saved, passed", [("Adam", "SGD"), ("SGD", "Adam")], ids=["Adam->SGD", "SGD->Adam"]
)
def test_optimizer_types_differ(tmp_path, saved, passed):
    source = small_model(seed=0)
    options = {"SGD": {"momentum": 0.9}, "Adam": {}}
    saved_optimizer = trained_optimizer(
        source, getattr(torch.optim, saved), **options[saved]
    )
    save_checkpoint(tmp_path / "c.pt", source, saved_optimizer, epoch=1)
    target = small_model(seed=1)
    optimizer = getattr(torch.optim, passed)(target.parameters(), lr=0.5)
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(OptimizerMismatchError) as error:
        load_checkpoint(tmp_path / "c.pt", target, optimizer)
    assert str(error.value) == (
        f"c.pt holds optimizer state saved from {saved}, but the optimizer passed is "
        f"{passed}: the optimizer types differ. Create the optimizer as {saved}, as "
        "when the checkpoint was saved, or pass optimizer=None to load only the "
        f"weights and start {passed} afresh."
    )
    assert isinstance(error.value, CheckpointMismatchError)
    assert optimizer.state_dict() == before  # nothing loaded ...
    assert_same_state(target, small_model(seed=1))  # ... into either


def test_an_old_file_without_the_optimizer_type_still_gets_a_clear_error(tmp_path):
    source = small_model(seed=0)
    sgd = trained_optimizer(source, torch.optim.SGD, momentum=0.9)
    save_checkpoint(tmp_path / "c.pt", source, sgd, epoch=1)
    old = torch.load(tmp_path / "c.pt", weights_only=True)
    del old["optimizer_type"]  # as saved before the type was recorded
    torch.save(old, tmp_path / "c.pt")
    target = small_model(seed=1)
    adam = torch.optim.Adam(target.parameters(), lr=0.5)
    before = copy.deepcopy(adam.state_dict())
    with (
        pytest.raises(OptimizerMismatchError) as error,
        pytest.warns(UserWarning, match="holds no checksum"),  # saved by torch.save
    ):
        load_checkpoint(tmp_path / "c.pt", target, adam)
    assert str(error.value) == (
        "c.pt holds optimizer state that does not fit Adam (KeyError: 'step'): it "
        "was saved from another optimizer type, or for another model. Create the "
        "same optimizer type for the same model as when the checkpoint was saved, or "
        "pass optimizer=None to load only the weights."
    )
    assert isinstance(error.value.__cause__, KeyError)
    assert adam.state_dict() == before  # put back as it was: it still steps
    nn.functional.mse_loss(target(torch.randn(8, 4)), torch.randn(8, 2)).backward()
    adam.step()
