"""The ``module.`` prefix both ways, unwrapping, and what PyTorch itself does."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn

from multigpu import dataparallel
from multigpu.core.devices import simulated_devices
from multigpu.runtime import checkpoint
from multigpu.runtime.checkpoint import (
    add_prefix,
    load_checkpoint,
    strip_prefix,
    unwrap,
)
from tests.runtime.checkpoint.helpers import assert_same_state, small_model

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
