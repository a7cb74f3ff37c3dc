"""The placement helpers: device_of, to_device."""

from __future__ import annotations

import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices


def test_placement_helpers():
    devices = simulated_devices(2)
    x = torch.ones(3)
    assert str(dp.device_of(x)) == "cpu"
    on_first = dp.to_device(x, devices[0])
    assert str(dp.device_of(on_first)) == "gpu:0"
    assert dp.to_device(on_first, "gpu:0") is on_first  # already there: no copy
    on_second = dp.to_device(on_first, "gpu:1")
    assert on_second.data_ptr() != on_first.data_ptr()  # another device: a copy
    model = nn.Linear(2, 2)
    assert dp.to_device(model, "gpu:1") is model  # moved in place
    assert {str(dp.device_of(p)) for p in model.parameters()} == {"gpu:1"}
    assert set(dp.DataParallel(model, devices).state_dict()) == {
        "module.weight",
        "module.bias",
    }
