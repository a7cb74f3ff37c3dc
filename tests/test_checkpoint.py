"""Tests for multigpu.checkpoint: the ``module.`` prefix both ways, atomic saves."""

from __future__ import annotations

import copy
from collections import OrderedDict
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch import nn

from multigpu import checkpoint, dataparallel
from multigpu.checkpoint import (
    CheckpointMismatchError,
    add_prefix,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
    strip_prefix,
    unwrap,
)
from multigpu.devices import simulated_devices


def small_model(seed: int = 0) -> nn.Module:
    """A model with parameters and buffers (BatchNorm), so metadata matters too."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = unwrap(a).state_dict(), unwrap(b).state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0)


@pytest.fixture
def single_process_group():
    """A one-rank gloo process group (in-memory store, no port), torn down after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# --- what PyTorch itself does -------------------------------------------------------


def test_real_dataparallel_adds_module_prefix_even_on_cpu():
    model = small_model()
    wrapped = nn.DataParallel(model)
    if not torch.cuda.is_available():
        assert wrapped.device_ids == []  # it will just call the module...
    # ...but its state_dict keys still carry the prefix: the model is its .module
    assert list(wrapped.state_dict()) == ["module." + k for k in model.state_dict()]


def test_real_ddp_adds_module_prefix(single_process_group):
    model = small_model()
    wrapped = nn.parallel.DistributedDataParallel(model)
    assert list(wrapped.state_dict()) == ["module." + k for k in model.state_dict()]
    assert unwrap(wrapped) is model


def test_real_error_loading_prefixed_state_into_plain_model():
    saved = nn.DataParallel(small_model()).state_dict()
    with pytest.raises(RuntimeError) as error:
        small_model().load_state_dict(saved)
    message = str(error.value)
    assert message.startswith("Error(s) in loading state_dict for Sequential:")
    assert 'Missing key(s) in state_dict: "0.weight", "0.bias"' in message
    assert 'Unexpected key(s) in state_dict: "module.0.weight"' in message


def test_real_error_loading_plain_state_into_wrapped_model():
    with pytest.raises(RuntimeError) as error:
        nn.DataParallel(small_model()).load_state_dict(small_model().state_dict())
    message = str(error.value)
    assert 'Missing key(s) in state_dict: "module.0.weight"' in message
    assert 'Unexpected key(s) in state_dict: "0.weight"' in message


# --- prefix helpers ---------------------------------------------------------------


def test_strip_prefix_gives_the_plain_state_dict_and_metadata():
    model = small_model()
    wrapped_state = nn.DataParallel(model).state_dict()
    keys_before = list(wrapped_state)
    stripped = strip_prefix(wrapped_state)
    plain = model.state_dict()
    assert list(stripped) == list(plain)
    assert all(stripped[k] is wrapped_state["module." + k] for k in plain)  # no copy
    assert stripped._metadata == plain._metadata
    assert list(wrapped_state) == keys_before  # the input is left alone
    small_model(seed=1).load_state_dict(stripped)  # strict load works


def test_add_prefix_gives_the_wrapped_state_dict_and_metadata():
    model = small_model()
    added = add_prefix(model.state_dict())
    wrapped_state = nn.DataParallel(model).state_dict()
    assert list(added) == list(wrapped_state)
    assert added._metadata == wrapped_state._metadata
    nn.DataParallel(small_model(seed=1)).load_state_dict(added)  # strict load works


def test_prefix_round_trip_and_custom_prefix():
    state = small_model().state_dict()
    assert list(strip_prefix(add_prefix(state))) == list(state)
    assert list(strip_prefix(state)) == list(state)  # nothing to strip: unchanged
    compiled_style = add_prefix(state, "_orig_mod.")
    assert next(iter(compiled_style)) == "_orig_mod.0.weight"
    assert list(strip_prefix(compiled_style, "_orig_mod.")) == list(state)


def test_strip_prefix_renames_only_the_keys_that_carry_it():
    state = small_model().state_dict()
    mixed = OrderedDict([("step", torch.tensor(3)), *add_prefix(state).items()])
    stripped = strip_prefix(mixed)
    assert set(stripped) == {"step", *state}
    assert stripped["step"] is mixed["step"]
    assert list(stripped)[1:] == list(state)  # the prefixed keys keep their order


def test_unwrap_plain_nested_and_reference_wrappers():
    model = small_model()
    assert unwrap(model) is model
    assert unwrap(nn.DataParallel(model)) is model
    assert unwrap(nn.DataParallel(nn.DataParallel(model))) is model
    assert not checkpoint.is_wrapped(model)


def test_unwrap_reference_dataparallel():
    model = small_model()
    wrapped = dataparallel.DataParallel(model, device_ids=simulated_devices(2))
    assert checkpoint.is_wrapped(wrapped)
    assert unwrap(wrapped) is model


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
    [None, "cpu", torch.device("cpu"), simulated_devices(2)[1]],
    ids=["default", "str", "torch.device", "simulated"],
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


# --- atomic saves -----------------------------------------------------------------


def interrupted_save(obj, file, *args, **kwargs):
    """Stands in for torch.save: writes half a file, then the user hits Ctrl-C."""
    file.write(b"PK\x03\x04 half a checkpoint")
    raise KeyboardInterrupt


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    model = small_model(seed=0)
    save_checkpoint(path, model, epoch=1)
    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, small_model(seed=1), epoch=2)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left
    restored = small_model(seed=2)
    assert load_checkpoint(path, restored)["epoch"] == 1
    assert_same_state(model, restored)


def test_a_plain_interrupted_torch_save_destroys_the_old_file(tmp_path):
    """Why the temporary file: writing in place truncates the old checkpoint first."""
    path = tmp_path / "c.pt"
    torch.save(small_model().state_dict(), path)
    with pytest.raises(KeyboardInterrupt), open(path, "wb") as file:
        interrupted_save(None, file)
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)


def test_save_overwrites_atomically(tmp_path):
    path = tmp_path / "c.pt"
    for epoch in range(3):
        save_checkpoint(path, small_model(seed=epoch), epoch=epoch)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert load_checkpoint(path, small_model())["epoch"] == 2


def test_nested_wrappers_save_and_load(tmp_path):
    source, target = small_model(seed=0), small_model(seed=1)
    doubly_wrapped = nn.DataParallel(nn.DataParallel(source))
    assert next(iter(doubly_wrapped.state_dict())) == "module.module.0.weight"
    torch.save(doubly_wrapped.state_dict(), tmp_path / "nested.pt")
    load_checkpoint(tmp_path / "nested.pt", target)
    assert_same_state(source, target)


def test_same_weights_compares_names_and_values_through_wrappers():
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    twin = copy.deepcopy(model)
    assert checkpoint.same_weights(nn.DataParallel(model), twin)
    with torch.no_grad():
        twin.bias[0] += 1e-6  # a last-digit change is a different weight
    assert not checkpoint.same_weights(model, twin)
    assert not checkpoint.same_weights(model, nn.Linear(2, 2, bias=False))  # names
