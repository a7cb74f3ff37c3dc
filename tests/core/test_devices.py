import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from multigpu.core import devices
from multigpu.core.devices import (
    Device,
    choose_backend,
    parse_visible_devices,
    physical_id,
    resolve_device,
    simulated_devices,
)
from multigpu.core.visible_devices import visible_gpus


def test_simulated_devices_are_named_gpus_on_the_cpu():
    sims = simulated_devices(3)
    assert [d.name for d in sims] == ["gpu:0", "gpu:1", "gpu:2"]
    assert all(d.simulated and d.torch_device == torch.device("cpu") for d in sims)
    assert [d.index for d in sims] == [0, 1, 2]
    assert str(sims[1]) == "gpu:1"


@pytest.mark.parametrize("count", [0, -1, 1.5, "2", True])
def test_simulated_device_count_below_one_is_a_clear_error(count):
    with pytest.raises(ValueError) as caught:
        simulated_devices(count)
    assert str(caught.value) == (
        f"count must be an integer of at least 1, got {count!r}. Ask for as many "
        "devices as you want to simulate, e.g. simulated_devices(4)."
    )


def test_resolve_device_accepts_the_usual_spellings():
    assert resolve_device("cpu") == Device("cpu", torch.device("cpu"))
    assert resolve_device(torch.device("cpu")).name == "cpu"
    assert resolve_device("GPU:2") == Device("gpu:2", torch.device("cpu"))
    sim = simulated_devices(1)[0]
    assert resolve_device(sim) is sim
    assert not resolve_device("cpu").simulated and resolve_device("cpu").index is None


@pytest.mark.parametrize("spec", ["tpu:0", "gpu", "gpu:x", "cuda:-1", 3.0, None, True])
def test_unknown_device_is_a_clear_error(spec):
    with pytest.raises(ValueError, match=r"Unknown device .*Use 'cpu', 'cuda:N'"):
        resolve_device(spec)


def fake_gpus(monkeypatch, count: int) -> None:
    """Make torch report ``count`` CUDA GPUs (none: CUDA not available)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    "gpus,spec",
    [(0, "cuda:0"), (0, "cuda"), (0, 0), (0, torch.device("cuda", 1)), (2, "cuda:2")],
)
def test_missing_cuda_device_says_how_many_exist(monkeypatch, gpus, spec):
    fake_gpus(monkeypatch, gpus)
    with pytest.raises(
        ValueError, match=rf"does not exist: this process sees {gpus} CUDA"
    ):
        resolve_device(spec)


def test_cuda_devices_resolve_when_torch_reports_them(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert resolve_device(1) == Device("cuda:1", torch.device("cuda", 1))
    assert resolve_device("cuda") == Device("cuda:0", torch.device("cuda", 0))
    assert not resolve_device("cuda:1").simulated


VISIBLE_CASES = [
    "",
    "0",
    "2,3",
    "3,2,1,0",
    "0,2,-1,3",
    "0,0",
    "1,2,1",
    "1gpu2,2ampere",
    " 1, 2",
    "+1,2",
    "a,1",
    "1,,2",
    "0x1",
    "-1",
    "GPU-abc,GPU-def",
    "GPU-abc,0",
    "MIG-x,MIG-x",
    "MIG-a,MIG-b,GPU-c",
]


@pytest.mark.parametrize("value", VISIBLE_CASES)
def test_visible_devices_parsing_matches_pytorch(value, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert parse_visible_devices(value) == torch.cuda._parse_visible_devices()


@pytest.mark.parametrize("gpu_count", [1, 2, 4])
@pytest.mark.parametrize("value", ["2,3", "3,1", "5,0", "1,3,0", "0,0", "1,a,2", ""])
def test_visible_gpus_counts_like_pytorch(value, gpu_count, monkeypatch):
    """As many GPUs as torch.cuda counts through NVML on a machine with gpu_count."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", lambda: gpu_count)
    expected = torch.cuda._device_count_nvml()
    assert visible_gpus(value, gpu_count) == parse_visible_devices(value)[:expected]


def test_visible_gpus_stop_at_the_first_missing_gpu():
    assert visible_gpus(None, 3) == [0, 1, 2]
    assert visible_gpus("1,3,0", 2) == [1]
    assert visible_gpus("5,0", 2) == []
    assert visible_gpus("GPU-abc,GPU-def", 1) == ["GPU-abc", "GPU-def"]


def test_unset_visible_devices_means_every_gpu_in_physical_order(monkeypatch):
    assert parse_visible_devices(None) is None
    # An explicit None means "unset", whatever this process's environment says.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert [physical_id(i, None) for i in range(3)] == [0, 1, 2]


def test_logical_ids_map_to_physical_ids():
    assert [physical_id(i, "2,3") for i in range(2)] == [2, 3]
    assert physical_id(0, "GPU-abc,GPU-def") == "GPU-abc"
    with pytest.raises(
        ValueError,
        match=r"Logical device 2 does not exist when "
        r"CUDA_VISIBLE_DEVICES='2,3': that shows 2 device\(s\)",
    ):
        physical_id(2, "2,3")


def test_physical_id_reads_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,1")
    assert physical_id(0) == 5 and physical_id(1) == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_id(3) == 3


def test_backend_is_gloo_on_cpu_and_nccl_on_cuda(monkeypatch):
    assert choose_backend("cpu") == "gloo"
    assert choose_backend("gpu:1") == "gloo"  # simulated devices compute on the CPU
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    assert choose_backend() == "gloo"
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    assert choose_backend() == "nccl"
    assert choose_backend("cuda:1") == "nccl"


def test_list_devices_is_the_cpu_then_every_gpu(monkeypatch):
    fake_gpus(monkeypatch, 2)
    models = {0: ("Big GPU", 80 * 2**30), 1: ("Small GPU", 2**29)}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(name=models[i][0], total_memory=models[i][1]),
    )
    cpu, *gpus = devices.list_devices()
    assert cpu.name == "cpu" and cpu.memory_gib is None
    assert cpu.threads == torch.get_num_threads()
    assert [(g.name, g.description, g.memory_gib, g.threads) for g in gpus] == [
        ("cuda:0", "Big GPU", 80.0, None),
        ("cuda:1", "Small GPU", 0.5, None),
    ]
    fake_gpus(monkeypatch, 0)
    assert [row.name for row in devices.list_devices()] == ["cpu"]


@pytest.mark.parametrize(
    "available,count,expected",
    [(False, 0, "cpu"), (False, 3, "cpu"), (True, 1, "cuda:0"), (True, 4, "cuda:0")],
)
def test_default_device_is_the_first_gpu_when_cuda_works(
    monkeypatch, available, count, expected
):
    # (False, 3): a device count is not enough, CUDA must also be available
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    device = devices.default_device()
    assert device.name == expected and not device.simulated
    assert device.torch_device == torch.device(expected)


@pytest.mark.gpu(1)
def test_real_cuda_device_resolves():
    device = resolve_device(0)
    assert device.torch_device == torch.device("cuda", 0) and not device.simulated
    assert choose_backend(device) == "nccl"


def test_the_visible_device_rules_import_without_torch():
    # notebook 00 starts child processes that only need these rules
    done = subprocess.run(
        [sys.executable, "-c", CHILD_IMPORTS_TORCH],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["2", "False"]


CHILD_IMPORTS_TORCH = (
    "import sys; from multigpu.core.visible_devices import physical_id; "
    "print(physical_id(0, '2,3'), 'torch' in sys.modules)"
)
