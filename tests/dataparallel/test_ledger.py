"""The memory ledger of a recorded step: every category counted exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices
from tests.dataparallel.helpers import small_model, tiny_model


def test_ledger_shows_the_output_device_holding_more():
    devices = simulated_devices(4)
    model = dp.to_device(small_model(), devices[0])
    X, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    loss, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    assert loss.dim() == 0
    totals = recorder.totals()
    assert sorted(totals) == [d.name for d in devices]
    assert all(totals["gpu:0"] > totals[d.name] for d in devices[1:])
    first = recorder.ledger["gpu:0"]
    assert first["gathered"] == 16 * 10 * 4 and first["loss"] == 4
    assert recorder.ledger["gpu:1"]["gathered"] == 0
    params = sum(p.numel() * 4 for p in model.parameters())
    assert {recorder.ledger[d.name]["parameters"] for d in devices} == {params}
    assert {recorder.ledger[d.name]["replica gradients"] for d in devices} == {params}
    assert first["gradients"] == params
    # ConvNet(width=4) saves per row: two ReLU outputs (4 and 8 channels of 8x8)
    # and the pooled features (8 x 2 x 2) that the classifier reads
    per_row = (4 * 64 + 8 * 64 + 8 * 4) * 4
    assert recorder.ledger["gpu:1"]["activations"] == 4 * per_row
    # the loss keeps its log-softmax (16 x 10) and a 1-element total weight
    assert first["activations"] == 4 * per_row + 16 * 10 * 4 + 4


def test_output_device_moves_the_gathered_outputs():
    devices = simulated_devices(3)
    model = dp.to_device(small_model(), devices[0])
    parallel = dp.DataParallel(model, devices, output_device=devices[2])
    X, y = torch.randn(9, 1, 8, 8), torch.randint(0, 10, (9,))
    loss, recorder = dp.record_step(parallel, X, y)
    assert str(dp.device_of(loss)) == "gpu:2"
    assert recorder.ledger["gpu:2"]["gathered"] > 0
    assert recorder.ledger["gpu:0"]["gathered"] == 0


@pytest.mark.parametrize(("count", "rows"), [(4, [3, 3, 3, 1]), (1, [10])])
def test_ledger_counts_every_category_exactly(count, rows):
    devices = simulated_devices(count)
    X, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    _, recorder = dp.record_step(dp.DataParallel(tiny_model(devices), devices), X, y)
    assert list(recorder.ledger) == [d.name for d in devices[: len(rows)]]
    for i, (device, n) in enumerate(zip(devices, rows, strict=False)):
        first = i == 0
        expected = {
            "parameters": 128,  # a replica of the 32 weights (the model on gpu:0)
            "inputs": n * 3 * 4 + (10 * 8 if first else 0),  # + int64 targets
            # saved for backward: the ReLU output (n x 5, also Linear 2's input);
            # on the output device the loss's log-softmax (10 x 2) + total weight
            "activations": n * 5 * 4 + (10 * 2 * 4 + 4 if first else 0),
            "outputs": n * 2 * 4,
            "gathered": 10 * 2 * 4 if first and count > 1 else 0,
            "loss": 4 if first else 0,
            # every replica's full set of weight gradients, before they are summed;
            # one device has no replicas: gradients go straight into .grad
            "replica gradients": 128 if count > 1 else 0,
            "gradients": 128 if first else 0,
        }
        assert recorder.ledger[device.name] == expected, device.name
        assert list(recorder.ledger[device.name]) == list(dp.MEMORY_CATEGORIES)


@pytest.mark.parametrize("count", [1, 3])
def test_ledger_with_a_missing_bias(count):
    devices = simulated_devices(count)
    model = dp.to_device(nn.Linear(3, 2, bias=False), devices[0])
    X, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    assert {held["parameters"] for held in recorder.ledger.values()} == {3 * 2 * 4}
    assert recorder.ledger["gpu:0"]["gradients"] == 3 * 2 * 4


def test_an_output_saved_for_backward_is_counted_once():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Sequential(nn.Linear(3, 5), nn.ReLU()), devices[0])
    recorder = dp.Recorder()
    out = recorder.watch(dp.DataParallel(model, devices))(torch.randn(4, 3))
    assert out.shape == (4, 5)
    for device in devices:  # ReLU saves its result, which is the output itself
        held = recorder.ledger[device.name]
        assert (held["activations"], held["outputs"]) == (0, 2 * 5 * 4)


def test_recording_keeps_the_in_place_check():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)

        def forward(self, x):
            out = self.linear(x).exp()  # exp saves its result for backward
            out.add_(1)  # ... which is then modified in place
            return out

    devices = simulated_devices(2)
    model = dp.to_device(InPlace(), devices[0])
    parallel = dp.DataParallel(model, devices)
    X, unused_targets = torch.randn(4, 2), torch.zeros(4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        dp.record_step(parallel, X, unused_targets, lambda out, _: out.sum())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        parallel(X).sum().backward()  # the same error without recording


def test_gradients_are_placed_with_their_parameters():
    devices = simulated_devices(3)
    model = tiny_model(devices)
    dp.DataParallel(model, devices)(torch.randn(6, 3)).sum().backward()
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:0"}
    dp.to_device(model, devices[2])  # moving the module moves its gradients too
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:2"}
    model.zero_grad(set_to_none=True)
    model(torch.randn(2, 3)).sum().backward()  # a new .grad, from a plain backward
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:2"}
    copied = copy.deepcopy(model)  # a copy is not placed, nor are its gradients
    copied(torch.randn(2, 3)).sum().backward()
    assert {str(dp.device_of(p)) for p in copied.parameters()} == {"cpu"}
    assert {str(dp.device_of(p.grad)) for p in copied.parameters()} == {"cpu"}
