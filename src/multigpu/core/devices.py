"""Devices: what this machine has, simulated GPUs, logical vs physical ids, backends.

Taught in ``notebooks/00_devices.ipynb``; the simulated devices are used by the
DataParallel notebooks (02-06).

A *simulated device* has a GPU-like name ("gpu:0", "gpu:1", ...) but computes on
the CPU. It lets a laptop run the same multi-device code paths as a GPU server:
the names say which replica a tensor belongs to, the arithmetic is real.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multigpu.core.checks import check_positive_int
from multigpu.core.visible_devices import (  # noqa: F401 (exported here too)
    FROM_ENVIRONMENT,
    parse_visible_devices,
    physical_id,
)

SIMULATED_PREFIX = "gpu"


@dataclass(frozen=True)
class Device:
    """A device as the lessons name it: ``name`` is what you see, ``torch_device``
    is where its tensors really live (the CPU for a simulated device)."""

    name: str  # "cpu", "cuda:1" or a simulated "gpu:1"
    torch_device: torch.device  # where the tensors are stored and computed

    @property
    def simulated(self) -> bool:
        """True for a simulated GPU that computes on the CPU."""
        return self.name.startswith(SIMULATED_PREFIX + ":")

    @property
    def index(self) -> int | None:
        """The number after the colon ("gpu:2" -> 2), None for "cpu"."""
        _, _, number = self.name.partition(":")
        return int(number) if number else None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DeviceInfo:
    """One row of :func:`list_devices`."""

    name: str  # "cpu" or "cuda:N" (logical id)
    description: str  # processor or GPU model
    memory_gib: float | None  # total memory of a GPU; None for the CPU
    threads: int | None  # torch intra-op threads for the CPU; None for a GPU


def cuda_device_count() -> int:
    """Number of CUDA devices this process can see (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def list_devices() -> list[DeviceInfo]:
    """The CPU and every visible CUDA device, in logical order (00_devices)."""
    import platform

    rows = [
        DeviceInfo(
            "cpu",
            platform.processor() or platform.machine(),
            None,
            torch.get_num_threads(),
        )
    ]
    for i in range(cuda_device_count()):
        props = torch.cuda.get_device_properties(i)
        rows.append(
            DeviceInfo(f"cuda:{i}", props.name, props.total_memory / 2**30, None)
        )
    return rows


def simulated_devices(count: int) -> list[Device]:
    """``count`` simulated GPUs named "gpu:0".."gpu:{count-1}", all computing on
    the CPU (02-06)."""
    check_positive_int(
        "count",
        count,
        "Ask for as many devices as you want to simulate, e.g. simulated_devices(4).",
    )
    return [
        Device(f"{SIMULATED_PREFIX}:{i}", torch.device("cpu")) for i in range(count)
    ]


def resolve_device(spec: Device | torch.device | str | int) -> Device:
    """Turn "cpu", "cuda:N", a simulated "gpu:N", an int N (a CUDA id) or a
    ``torch.device`` into a :class:`Device`; raise a clear error otherwise."""
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, bool):
        raise _unknown_device(spec)
    if isinstance(spec, int):
        spec = f"cuda:{spec}"
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not isinstance(spec, str):
        raise _unknown_device(spec)
    text = spec.strip().lower()
    kind, colon, number = text.partition(":")
    if colon and not number.isdigit():
        raise _unknown_device(spec)
    if text == "cpu":
        return Device("cpu", torch.device("cpu"))
    if kind == SIMULATED_PREFIX and colon:
        return Device(f"{SIMULATED_PREFIX}:{int(number)}", torch.device("cpu"))
    if kind == "cuda":
        index = int(number) if colon else 0
        available = cuda_device_count()
        if index >= available:
            raise ValueError(
                f"Device {spec!r} does not exist: this process sees {available} "
                "CUDA device(s). Use an id below that, or simulated devices "
                "(multigpu.core.devices.simulated_devices) on a machine without GPUs."
            )
        return Device(f"cuda:{index}", torch.device("cuda", index))
    raise _unknown_device(spec)


def _unknown_device(spec: object) -> ValueError:
    return ValueError(
        f"Unknown device {spec!r}. Use 'cpu', 'cuda:N' for a real GPU, or "
        f"'{SIMULATED_PREFIX}:N' for a simulated one."
    )


def default_device() -> Device:
    """``cuda:0`` when a GPU is visible, else ``cpu`` (01)."""
    return resolve_device("cuda:0" if cuda_device_count() else "cpu")


def choose_backend(device: Device | torch.device | str | None = None) -> str:
    """The torch.distributed backend for a device: "nccl" for CUDA, else "gloo"
    (07-11). With no device: "nccl" when a GPU is visible, else "gloo"."""
    if device is None:
        return "nccl" if cuda_device_count() else "gloo"
    resolved = resolve_device(device)
    return "nccl" if resolved.torch_device.type == "cuda" else "gloo"
