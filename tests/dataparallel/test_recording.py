"""Recording from outside: the timeline, and a recorder that changes nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices
from tests.dataparallel.helpers import small_model


def test_timeline_has_events_for_every_replica():
    devices = simulated_devices(4)
    model = dp.to_device(small_model(), devices[0])
    X, y = torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    events = recorder.events
    for name in ("scatter", "replicate", "forward", "backward"):
        assert {e.device for e in events if e.name == name} == {
            d.name for d in devices
        }, name
    assert [e.device for e in events if e.name in ("gather", "loss")] == ["gpu:0"] * 2
    assert all(0 <= e.start <= e.end for e in events)
    forward_end = max(e.end for e in events if e.name == "forward")
    gather = next(e for e in events if e.name == "gather")
    assert gather.start >= forward_end  # the gather waits for every replica
    # as in PyTorch, scatter (comm.scatter) and replicate (one coalesced broadcast)
    # are each one call for all the devices: one span, drawn on every lane
    spans = {
        name: {(e.start, e.end) for e in events if e.name == name}
        for name in ("scatter", "replicate")
    }
    assert [len(s) for s in spans.values()] == [1, 1]
    [(_, scatter_end)], [(replicate_start, replicate_end)] = spans.values()
    assert scatter_end <= replicate_start
    assert replicate_end <= min(e.start for e in events if e.name == "forward")


def test_one_device_timeline():
    devices = simulated_devices(1)
    X, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    _, recorder = dp.record_step(dp.DataParallel(small_model(), devices), X, y)
    names = [e.name for e in recorder.events]
    assert names == ["scatter", "forward", "loss", "backward"]  # no replicas
    assert set(recorder.ledger) == {"gpu:0"}


# ---------------------------------------------------------------------------
# (f) the recorder attaches from outside
# ---------------------------------------------------------------------------


def test_recording_changes_nothing_it_records():
    devices = simulated_devices(3)
    X, y = torch.randn(7, 1, 8, 8), torch.randint(0, 10, (7,))
    plain_model, watched_model = small_model(), small_model()
    plain = dp.DataParallel(dp.to_device(plain_model, devices[0]), devices)
    watched = dp.DataParallel(dp.to_device(watched_model, devices[0]), devices)
    recorder = dp.Recorder()
    recorded = recorder.watch(watched)
    assert recorded.module is watched_model  # shares the module, copies nothing
    assert recorded.state_dict().keys() == plain.state_dict().keys()
    out_plain, out_recorded = plain(X), recorded(X)
    torch.testing.assert_close(out_recorded, out_plain, rtol=0, atol=0)
    nn.functional.cross_entropy(out_plain, y).backward()
    nn.functional.cross_entropy(out_recorded, y).backward()
    for p, q in zip(plain_model.parameters(), watched_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)
    assert sorted({e.device for e in recorder.events}) == ["gpu:0", "gpu:1", "gpu:2"]
    # per device: scatter, replicate, forward, backward; one gather on gpu:0
    assert len(recorder.events) == 3 * 4 + 1
    first, last = (
        min(e.start for e in recorder.events),
        max(e.end for e in recorder.events),
    )
    assert recorder.duration() == last - first > 0
    assert dp.Recorder().duration() == 0.0  # nothing recorded yet
    # the plain module records nothing: recording lives in RecordingDataParallel
    assert not hasattr(plain, "recorder")


def test_watch_needs_our_dataparallel():
    with pytest.raises(TypeError) as error:
        dp.Recorder().watch(nn.Linear(2, 2))
    assert str(error.value) == (
        "Recorder.watch records a multigpu.dataparallel.DataParallel, got Linear. "
        "Wrap your module first, e.g. dp.DataParallel(model, devices)."
    )


def test_replica_weights_are_the_replicas_copies():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), devices[0])
    model[1].weight = model[0].bias  # one tensor shared by two submodules
    replicas = dp.replicate(model, devices)
    originals = [*model.parameters(), *model.buffers()]
    for device, replica in zip(devices, replicas, strict=True):
        copies = dp.replica_weights(model, replica)
        assert len(copies) == len(originals) == 2 + 1 + 3  # the shared one once
        for replica_copy, original in zip(copies, originals, strict=True):
            torch.testing.assert_close(replica_copy, original, rtol=0, atol=0)
            assert dp.device_of(replica_copy) == device
            shared = replica_copy.data_ptr() == original.data_ptr()
            assert shared == (device == devices[0])


def test_watch_moves_sees_only_the_moves_inside_it():
    from multigpu.dataparallel.placement import watch_moves

    seen = []
    x = torch.ones(4)
    with watch_moves(lambda moved, device, start, end: seen.append(device.name)):
        dp.to_device(x, "gpu:1")
        dp.scatter(x, simulated_devices(2))
    dp.to_device(x, "gpu:0")
    assert seen == ["gpu:1", "gpu:0", "gpu:1"]
