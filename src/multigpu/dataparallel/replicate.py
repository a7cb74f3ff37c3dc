"""Step 2 of DataParallel: ``replicate`` the module onto every device.

Mirrors PyTorch's ``torch/nn/parallel/replicate.py``
(https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/replicate.py) on any
list of devices, simulated ones included (notebook 02). ``replicate(network,
devices, detach=False)`` makes one replica per device. Each replica is a shallow
copy of every submodule (PyTorch's ``Module._replicate_for_data_parallel``) whose
weights are plain attributes, not parameters: differentiable copies of the
original's, so ``backward`` sums each replica's gradients into the original
parameters. On the device that already holds a weight, the copy is a view sharing
its storage (no memory is copied), as PyTorch's broadcast does on its source device.
``replica_weights(network, replica)`` lists a replica's copies.

The copies come from one autograd function per device, ``_Broadcast``: all of a
replica's weights in one node, as PyTorch's ``Broadcast`` (in
``torch/nn/parallel/_functions.py``) makes all replicas' weights in one node whose
backward, ``ReduceAddCoalesced``, sums them. Autograd hands such a function zeros
for the outputs that got no gradient (``ctx.set_materialize_grads``, on by
default), so a parameter the forward never uses gets a ``.grad`` of zeros, not
``None``, as under ``nn.DataParallel`` on two or more GPUs; notebook 02 shows why
that matters to SGD with momentum or weight decay. A weight with
``requires_grad=False`` gets no gradient, and with one device DataParallel calls
the module itself, so an unused parameter keeps ``None`` there, as in PyTorch.
(Here autograd adds the devices' gradients into ``.grad`` one node at a time; the
same sum as PyTorch's, in another order.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from multigpu.core.devices import Device
from multigpu.dataparallel.placement import (
    DeviceSpec,
    check_devices,
    device_of,
    move,
    place,
)

__all__ = ["replica_weights", "replicate"]


def _copy(tensor: torch.Tensor, source: Device, device: Device) -> torch.Tensor:
    """``tensor`` (living on ``source``) on ``device``; on ``source`` itself a view
    sharing its storage."""
    if source.name == device.name:
        copy = tensor.view_as(tensor)
    else:
        copy = move(tensor, source, device)
    return place(copy, device)


class _Broadcast(torch.autograd.Function):
    """Every tensor to one device; backward sends each copy's gradient back to its
    tensor's device, zeros for a copy the forward left unused."""

    @staticmethod
    def forward(ctx: Any, device: Device, *tensors: torch.Tensor) -> Any:
        ctx.sources = [device_of(t) for t in tensors]
        copies = [_copy(t, s, device) for t, s in zip(tensors, ctx.sources)]
        needs = ctx.needs_input_grad[1:]
        ctx.mark_non_differentiable(*(c for c, n in zip(copies, needs) if not n))
        return tuple(copies)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        needs = ctx.needs_input_grad[1:]
        return (
            None,
            *(
                grad.to(source.torch_device) if need else None
                for grad, source, need in zip(grads, ctx.sources, needs)
            ),
        )


def _broadcast(
    tensors: list[torch.Tensor], devices: list[Device], detach: bool
) -> list[list[torch.Tensor]]:
    """Per device, a copy of each of ``tensors``: differentiable unless ``detach``."""
    if not tensors:
        return [[] for _ in devices]
    sources = [device_of(t) for t in tensors]  # before detach() forgets them
    if detach:
        return [
            [_copy(t.detach(), s, device) for t, s in zip(tensors, sources)]
            for device in devices
        ]
    return [list(_Broadcast.apply(device, *tensors)) for device in devices]


def _build_replica(
    network: nn.Module, copy_of: dict[torch.Tensor, torch.Tensor]
) -> nn.Module:
    """A replica of ``network`` whose weights are ``copy_of[original]``."""
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
    targets = check_devices(devices, "replicate")
    params = list(network.parameters())
    buffers = list(network.buffers())
    differentiable = [b for b in buffers if b.requires_grad and not detach]
    plain = [b for b in buffers if not (b.requires_grad and not detach)]
    per_device = zip(
        _broadcast(params, targets, detach),
        _broadcast(differentiable, targets, detach),
        _broadcast(plain, targets, True),
        strict=True,
    )
    originals = [*params, *differentiable, *plain]
    return [
        _build_replica(network, dict(zip(originals, [*p, *d, *b], strict=True)))
        for p, d, b in per_device
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
