"""The ``DataParallel`` module, built from the four steps.

Mirrors PyTorch's ``torch/nn/parallel/data_parallel.py``
(https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/data_parallel.py),
whose ``forward`` is the same four calls: ``scatter``, ``replicate``,
``parallel_apply``, ``gather`` (notebooks 02-06). As in PyTorch they are methods, so
a subclass can change or observe one step (the recorder in ``recording.py`` does).

Same ``forward`` logic as PyTorch's: the ``device_ids[0]`` check and its error text,
one device id -> the module is called directly, replicas
``device_ids[:len(inputs)]``, ``output_device`` defaulting to ``device_ids[0]``, the
``module.`` prefix in ``state_dict``. ``device_ids`` may hold ``Device`` objects,
"gpu:N", "cuda:N", ints (CUDA ids) or ``torch.device``; ``dp.device_ids`` and
``dp.output_device`` are ``Device``. Unlike PyTorch, it never falls back silently:
no ``device_ids`` on a machine without CUDA, an empty list or an unknown device is
a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn

from multigpu.core.devices import Device, cuda_device_count
from multigpu.dataparallel.parallel_apply import parallel_apply
from multigpu.dataparallel.placement import (
    DeviceSpec,
    check_devices,
    device_of,
    resolve,
    to_device,
)
from multigpu.dataparallel.replicate import replicate
from multigpu.dataparallel.scatter_gather import gather, scatter_kwargs

__all__ = ["DataParallel"]


class DataParallel(nn.Module):
    """``nn.DataParallel`` rebuilt from scatter, replicate, parallel_apply and
    gather; works on simulated devices as well as real GPUs (02-06)."""

    # multigpu.runtime.checkpoint unwraps it (``.module``) without importing it
    _is_data_parallel_wrapper = True

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[DeviceSpec] | None = None,
        output_device: DeviceSpec | None = None,
        dim: int = 0,
    ) -> None:
        super().__init__()
        if device_ids is None:
            if cuda_device_count() == 0:
                raise ValueError(
                    "DataParallel got no device_ids and this machine has no CUDA "
                    "GPU. Pass simulated devices, e.g. "
                    "device_ids=multigpu.core.devices.simulated_devices(2)."
                )
            device_ids = list(range(cuda_device_count()))
        self.dim = dim
        self.module = module
        self.device_ids: list[Device] = check_devices(device_ids, "DataParallel")
        self.output_device: Device = (
            self.device_ids[0] if output_device is None else resolve(output_device)
        )
        self.src_device = self.device_ids[0]
        if len(self.device_ids) == 1:
            to_device(self.module, self.src_device)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        for t in chain(self.module.parameters(), self.module.buffers()):
            if device_of(t).name != self.src_device.name:
                raise RuntimeError(
                    "module must have its parameters and buffers "
                    f"on device {self.src_device} (device_ids[0]) but found one of "
                    f"them on device: {device_of(t)}"
                )
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        # no inputs at all: run the module once, on the first device
        if not inputs and not module_kwargs:
            inputs = ((),)
            module_kwargs = ({},)
        if len(self.device_ids) == 1:
            return self.module(*inputs[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(
        self, module: nn.Module, device_ids: Sequence[DeviceSpec]
    ) -> list[nn.Module]:
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(
        self,
        inputs: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        device_ids: Sequence[DeviceSpec],
    ) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(
        self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        return parallel_apply(
            replicas, inputs, kwargs, self.device_ids[: len(replicas)]
        )

    def gather(self, outputs: Any, output_device: DeviceSpec) -> Any:
        return gather(outputs, output_device, dim=self.dim)

    def extra_repr(self) -> str:
        names = ", ".join(str(d) for d in self.device_ids)
        return f"device_ids=[{names}], output_device={self.output_device}"
