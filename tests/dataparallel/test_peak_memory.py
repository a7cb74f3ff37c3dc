"""The measured peak of a recorded step, against the allocator's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices
from tests.dataparallel.helpers import small_model, tiny_model


def _allocator_peak(step):
    """Run ``step()`` under PyTorch's profiler and return (the most bytes the CPU
    allocator held at once above what it held before, step's result): an
    independent count, from the allocator's own reports, of the current thread."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    events = prof.profiler.kineto_results.events()
    memory = sorted(
        (e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    held = peak = 0
    for event in memory:  # + bytes allocated, - bytes freed
        held += event.nbytes()
        peak = max(peak, held)
    return peak, result


@pytest.mark.parametrize("batch", [1, 64, 333])
def test_one_device_peak_matches_the_allocator(batch):
    # One device: the whole step runs in this thread, where the profiler sees every
    # allocation. An MLP's ops allocate nothing but their results, so the two
    # counts agree to the byte, on the first step and on the next (which sums
    # into the .grad of the first).
    torch.manual_seed(0)
    devices = simulated_devices(1)
    mlp = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))
    parallel = dp.DataParallel(dp.to_device(mlp, devices[0]), devices)
    X, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    weights = sum(p.numel() * 4 for p in mlp.parameters())
    for held_before in (weights, 2 * weights):  # the weights, then also .grad
        peak, (_, recorder) = _allocator_peak(lambda: dp.record_step(parallel, X, y))
        assert list(recorder.peak) == ["gpu:0"]
        assert recorder.peak["gpu:0"] == held_before + peak
        assert recorder.live == {"gpu:0": 2 * weights + 4}  # + .grad, + the loss


def test_replica_peaks_by_hand():
    # Linear(3, 5) -> ReLU -> Linear(5, 2) on 2 devices, 4 rows each (float32).
    devices = simulated_devices(2)
    X, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    chunk, weights, hidden, out = 4 * 3 * 4, 128, 4 * 5 * 4, 4 * 2 * 4
    recorder = dp.Recorder()
    recorder.watch(dp.DataParallel(tiny_model(devices), devices))(X)  # forward only
    # gpu:1, in its replica's thread: its chunk and its copy of the weights, and at
    # the ReLU the first Linear's output next to the ReLU's (which replaces it).
    # gpu:0 holds the same (its replica is the model itself), then the gathered
    # outputs (8 x 2) next to its own output and the ReLU's, which backward needs.
    assert recorder.peak == {
        "gpu:0": chunk + weights + hidden + out + 8 * 2 * 4,
        "gpu:1": chunk + weights + 2 * hidden,
    }
    assert recorder.peak["gpu:1"] == 336
    # a whole step: backward on gpu:1 never holds more than its forward did, and
    # afterwards only the model's weights, their .grad and the loss remain
    _, recorder = dp.record_step(dp.DataParallel(tiny_model(devices), devices), X, y)
    assert recorder.peak["gpu:1"] == 336
    assert recorder.live == {"gpu:0": 2 * weights + 4, "gpu:1": 0}


def test_the_ledger_is_not_the_peak():
    # ConvNet(width=4): a convolution's output lives until its ReLU replaces it,
    # and backward holds activation gradients next to the activations, so the
    # measured peak exceeds the sum of the ledger on every device.
    devices = simulated_devices(4)
    model = dp.to_device(small_model(), devices[0])
    X, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    totals, peak = recorder.totals(), recorder.peak
    assert list(peak) == list(totals) == [d.name for d in devices]
    assert all(peak[d] > totals[d] for d in totals)
    assert peak["gpu:1"] == peak["gpu:2"] == peak["gpu:3"] < peak["gpu:0"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert recorder.live == {
        "gpu:0": 2 * params + 4,
        "gpu:1": 0,
        "gpu:2": 0,
        "gpu:3": 0,
    }
    # the same step untracked: the same ledger and timeline, no peak
    model.zero_grad(set_to_none=True)
    _, untracked = dp.record_step(
        dp.DataParallel(model, devices), X, y, track_memory=False
    )
    assert untracked.ledger == recorder.ledger
    assert untracked.peak == {} and untracked.live == {}
    assert sorted((e.device, e.name) for e in untracked.events) == sorted(
        (e.device, e.name) for e in recorder.events
    )


@pytest.mark.gpu(1)
def test_peak_matches_cuda_max_memory_allocated():
    # On a real GPU the caching allocator counts every byte: the measured peak
    # above what was held before equals its peak, up to its rounding of each
    # block to 512 bytes (and the few bytes its kernels allocate inside one op).
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1000))
    parallel = dp.DataParallel(mlp.to("cuda:0"), ["cuda:0"])
    X, y = torch.randn(512, 1024), torch.randint(0, 1000, (512,))
    dp.record_step(parallel, X, y)  # warm up: cuBLAS's workspace, the kernels
    mlp.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    torch.cuda.reset_peak_memory_stats(0)
    _, recorder = dp.record_step(parallel, X, y)
    torch.cuda.synchronize()
    allocator = torch.cuda.max_memory_allocated(0) - before
    weights = sum(p.numel() * p.element_size() for p in mlp.parameters())
    assert list(recorder.peak) == ["cuda:0"]
    assert recorder.peak["cuda:0"] - weights == pytest.approx(allocator, rel=0.01)
