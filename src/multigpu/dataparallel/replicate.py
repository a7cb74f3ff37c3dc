"""Step 2 of DataParallel: ``replicate`` the module onto every device.

Mirrors PyTorch's ``torch/nn/parallel/replicate.py``
(https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/replicate.py) on any
list of devices, simulated ones included (notebook 02). ``replicate(network,
devices, detach=False)`` makes one replica per device. Each replica is a shallow
copy of every submodule (PyTorch's ``Module._replicate_for_data_parallel``) whose
weights are plain attributes, not parameters: differentiable copies of the
original's, so ``backward`` sums each replica's gradients into the original
parameters. On the device that already holds a weight, the copy is a view sharing
its storage (no memory is copied), as PyTorch's ``Broadcast`` does on its source
device. ``replica_weights(network, replica)`` lists a replica's copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..devices import Device
from .placement import DeviceSpec, check_devices, device_of, move, place

__all__ = ["replica_weights", "replicate"]


def _copy_weights(
    tensors: list[torch.Tensor], device: Device, detach: bool
) -> list[torch.Tensor]:
    """``tensors`` on ``device``: differentiable copies unless ``detach``; on the
    device that already holds a tensor, a view sharing its storage."""
    copies = []
    for tensor in tensors:
        source = device_of(tensor)
        if detach:
            copy = tensor.detach()
            if source.name != device.name:
                copy = move(copy, source, device)
        elif source.name == device.name:
            copy = tensor.view_as(tensor)  # shares storage, grads flow back
        else:
            copy = move(tensor, source, device)
        copies.append(place(copy, device))
    return copies


def _replicate_one(network: nn.Module, device: Device, detach: bool) -> nn.Module:
    """One replica of ``network`` on ``device``."""
    params = list(network.parameters())
    buffers = list(network.buffers())
    differentiable = [b for b in buffers if b.requires_grad and not detach]
    plain = [b for b in buffers if not (b.requires_grad and not detach)]
    copy_of: dict[torch.Tensor, torch.Tensor] = {}  # original -> copy (by identity)
    copy_of.update(zip(params, _copy_weights(params, device, detach), strict=True))
    copy_of.update(
        zip(differentiable, _copy_weights(differentiable, device, detach), strict=True)
    )
    copy_of.update(zip(plain, _copy_weights(plain, device, True), strict=True))

    modules = list(network.modules())
    # The hook PyTorch calls: a shallow copy without parameters of its own
    # (subclasses such as RNNs override it).
    module_copies = {m: m._replicate_for_data_parallel() for m in modules}
    for module in modules:
        replica = module_copies[module]
        for key, child in module._modules.items():
            if child is None:
                replica._modules[key] = None
            else:
                setattr(replica, key, module_copies[child])
        for key, param in module._parameters.items():
            if param is None:
                replica._parameters[key] = None
            else:
                # not leaves any more: set as plain attributes, as PyTorch does
                setattr(replica, key, copy_of[param])
        for key, buf in module._buffers.items():
            if buf is None:
                replica._buffers[key] = None
            else:
                setattr(replica, key, copy_of[buf])
    return module_copies[network]


def replicate(
    network: nn.Module, devices: Sequence[DeviceSpec], detach: bool = False
) -> list[nn.Module]:
    """One replica of ``network`` per device; gradients flow back to ``network``'s
    parameters unless ``detach`` (02)."""
    if not devices:
        return []
    return [
        _replicate_one(network, device, detach)
        for device in check_devices(devices, "replicate")
    ]


def replica_weights(network: nn.Module, replica: nn.Module) -> list[torch.Tensor]:
    """The replica's copies of ``network``'s parameters, then of its buffers, each
    once (a weight shared by two submodules is listed once) (02, 03)."""
    copies: dict[int, torch.Tensor] = {}  # id(original) -> copy
    pairs = list(zip(network.modules(), replica.modules(), strict=True))
    for original, copy in pairs:
        for key, param in original._parameters.items():
            if param is not None:
                copies.setdefault(id(param), getattr(copy, key))
    for original, copy in pairs:
        for key, buf in original._buffers.items():
            if buf is not None:
                copies.setdefault(id(buf), copy._buffers[key])
    return list(copies.values())
