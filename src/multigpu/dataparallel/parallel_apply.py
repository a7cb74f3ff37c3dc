"""Step 3 of DataParallel: run every replica on its chunk, each in its own thread.

Mirrors PyTorch's ``torch/nn/parallel/parallel_apply.py``
(https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/parallel_apply.py)
on any list of devices, simulated ones included (notebooks 02, 04).
``parallel_apply(modules, inputs, kwargs_tup=None, devices=None)`` calls
``modules[i](*inputs[i], **kwargs_tup[i])`` in thread i, on device i. An exception
in a replica is re-raised in the caller as ``Caught TypeError in replica 3 on device
gpu:3.`` plus the original message; the original exception, with its full
traceback, is chained as ``__cause__`` rather than pasted into the message, so the
message is the same on every machine.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from multigpu.core.devices import Device
from multigpu.dataparallel.placement import (
    DeviceSpec,
    device_of,
    is_placed,
    place,
    resolve,
    tensors_in,
)

__all__ = ["parallel_apply"]


class _ReplicaError:
    """An exception caught in a replica's thread, re-raised in the caller with
    PyTorch's ``Caught <type> in replica i on device d.`` first line."""

    def __init__(self, where: str) -> None:
        exc_type, exc, _ = sys.exc_info()
        self.exc_type = exc_type
        self.exc = exc
        self.where = where

    def reraise(self) -> None:
        if self.exc is None or self.exc_type is None:  # no exception, only a message
            raise RuntimeError(f"Caught an error {self.where}.")
        original = "".join(traceback.format_exception_only(self.exc_type, self.exc))
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {original}"
        msg = msg.rstrip("\n")
        if self.exc_type is KeyError:
            raise _KeyErrorMessage(msg) from self.exc
        try:
            exception = self.exc_type(msg)
        except Exception:
            raise RuntimeError(msg) from self.exc  # noqa: B904
        raise exception from self.exc


class _KeyErrorMessage(KeyError):
    """A KeyError whose message is shown as written, not repr'd."""

    def __str__(self) -> str:
        return str(self.args[0])


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for result in map(_first_tensor, obj):
            if isinstance(result, torch.Tensor):
                return result
    if isinstance(obj, dict):
        for result in map(_first_tensor, obj.items()):
            if isinstance(result, torch.Tensor):
                return result
    return None


@contextmanager
def _on_device(device: Device) -> Iterator[None]:
    """Run on ``device``: the CUDA device, its current stream and the caller's
    autocast setting for a GPU; only the autocast setting for the CPU."""
    kind = device.torch_device.type
    autocast_enabled = torch.is_autocast_enabled(kind)
    if kind == "cuda":
        index = device.torch_device.index
        with (
            torch.cuda.device(index),
            torch.cuda.stream(torch.cuda.current_stream(index)),
            torch.autocast(kind, enabled=autocast_enabled),
        ):
            yield
    else:
        with torch.autocast(kind, enabled=autocast_enabled):
            yield


def parallel_apply(
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    kwargs_tup: Sequence[dict[str, Any]] | None = None,
    devices: Sequence[DeviceSpec | None] | None = None,
) -> list[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` on ``devices[i]``, each in
    its own thread; re-raise a replica's exception naming it (02, 04)."""
    if len(modules) != len(inputs):
        raise AssertionError(
            f"The number of modules {len(modules)} is not equal to "
            f"the number of inputs {len(inputs)}"
        )
    if kwargs_tup is not None:
        if len(modules) != len(kwargs_tup):
            raise AssertionError(
                f"The number of modules {len(modules)} is not equal to "
                f"the number of kwargs_tup {len(kwargs_tup)}"
            )
    else:
        kwargs_tup = ({},) * len(modules)
    if devices is not None:
        if len(modules) != len(devices):
            raise AssertionError(
                f"The number of modules {len(modules)} is not equal to "
                f"the number of devices {len(devices)}"
            )
        targets: list[Device | None] = [
            None if d is None else resolve(d) for d in devices
        ]
    else:
        targets = [None] * len(modules)
    lock = threading.Lock()
    results: dict[int, Any] = {}
    grad_enabled = torch.is_grad_enabled()

    def _worker(
        i: int,
        module: nn.Module,
        input: Any,
        kwargs: dict[str, Any],
        device: Device | None,
    ) -> None:
        torch.set_grad_enabled(grad_enabled)  # a new thread starts with the default
        if device is None:
            tensor = _first_tensor(input)
            if tensor is None:
                with lock:
                    results[i] = _ReplicaError(
                        f"in replica {i}, no device was provided and no tensor "
                        "input was found; device cannot be resolved"
                    )
                return
            device = device_of(tensor)
        try:
            with _on_device(device):
                if not isinstance(input, (list, tuple)):
                    input = (input,)  # a lone tensor is one argument, not a batch
                output = module(*input, **kwargs)
            for tensor in tensors_in(output):
                if not is_placed(tensor):  # a new tensor computed on this device
                    place(tensor, device)
            with lock:
                results[i] = output
        except Exception:
            with lock:
                results[i] = _ReplicaError(f"in replica {i} on device {device}")

    if len(modules) > 1:
        threads = [
            threading.Thread(target=_worker, args=(i, module, input, kwargs, device))
            for i, (module, input, kwargs, device) in enumerate(
                zip(modules, inputs, kwargs_tup, targets, strict=True)
            )
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        _worker(0, modules[0], inputs[0], kwargs_tup[0], targets[0])

    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, _ReplicaError):
            output.reraise()
        outputs.append(output)
    return outputs
