"""What each device holds and when it works: a memory ledger, the measured peak and
a timeline.

Not part of PyTorch: this is how notebooks 03 and 06 look inside a DataParallel
step. It attaches from outside, through PyTorch's own extension points:
``RecordingDataParallel`` is a ``DataParallel`` whose ``scatter``, ``replicate``,
``parallel_apply`` and ``gather`` methods call the plain steps and record what they
did; the four steps themselves know nothing about recording.

Use it as ``recorder = Recorder(); out = recorder.watch(model)(x)`` (``watch`` wraps
an existing ``DataParallel``, sharing its module), or ``loss, recorder =
record_step(model, inputs, targets)`` for one full step (forward, loss on
``output_device``, backward). The recorder then has:

- ``recorder.ledger``: device name -> category -> bytes, categories in
  ``MEMORY_CATEGORIES`` (``ledger.py``); ``recorder.totals()`` sums them per device;
- ``recorder.peak``: device name -> the most bytes of tensors the device held at
  once, measured; ``recorder.live``: the bytes it holds now (after
  ``record_step``: what the step left behind);
- ``recorder.events``: ``DeviceEvent(device, name, start, end)`` in seconds since the
  recorder was made, names "scatter", "replicate", "forward", "gather", "loss",
  "backward". As in PyTorch, scatter and replicate are each one call for all the
  devices (``comm.scatter``, ``comm.broadcast_coalesced``), so each is one span,
  drawn on every device it serves. A replica's backward is timed by autograd hooks,
  from the first gradient reaching its output to the last reaching its weights.

``recorder.hold(device, category, tensors)`` and ``with recorder.span(device,
name):`` add your own entries. Draw them with ``multigpu.plots.plot_memory`` and
``plot_timeline``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from multigpu.core.devices import Device
from multigpu.dataparallel._activations import _catch_activations
from multigpu.dataparallel._peak_memory import _Memory
from multigpu.dataparallel.data_parallel import DataParallel
from multigpu.dataparallel.ledger import MEMORY_CATEGORIES
from multigpu.dataparallel.placement import (
    DeviceSpec,
    nbytes,
    resolve,
    tensors_in,
    watch_moves,
)
from multigpu.dataparallel.replicate import replica_weights

__all__ = ["DeviceEvent", "Recorder", "RecordingDataParallel"]


@dataclass(frozen=True)
class DeviceEvent:
    """One span of work on one device; times in seconds since recording began."""

    device: str  # "gpu:0"
    name: str  # "scatter", "replicate", "forward", "gather", "loss", "backward"
    start: float
    end: float


class Recorder:
    """What the DataParallel steps run through ``recorder.watch(model)`` create per
    device (``ledger``), the most each device holds at once (``peak``) and when
    each step runs (``events``) (03, 06). ``track_memory=False`` leaves out the
    peak, which slows every op down (06 times steps without it)."""

    def __init__(self, track_memory: bool = True) -> None:
        self.ledger: dict[str, dict[str, int]] = {}  # device -> category -> bytes
        self._events: list[DeviceEvent] = []
        self._backward_spans: list[_BackwardSpan] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._memory = _Memory()
        if not track_memory:  # the peak costs time: a Python call for every op
            self._memory.close()

    def watch(self, model: DataParallel) -> RecordingDataParallel:
        """``model`` (a ``multigpu.dataparallel.DataParallel``) recorded by this
        recorder: a ``RecordingDataParallel`` sharing its module and devices."""
        if not isinstance(model, DataParallel):
            raise TypeError(
                "Recorder.watch records a multigpu.dataparallel.DataParallel, got "
                f"{type(model).__name__}. Wrap your module first, e.g. "
                "dp.DataParallel(model, devices)."
            )
        return RecordingDataParallel(
            model.module, model.device_ids, model.output_device, model.dim, self
        )

    def now(self) -> float:
        """Seconds since the recorder was made."""
        return time.perf_counter() - self._t0

    def hold(self, device: DeviceSpec, category: str, obj: Any) -> None:
        """Add the bytes of every tensor in ``obj`` to ``device``'s ``category``."""
        self.hold_bytes(device, category, nbytes(obj))

    def hold_bytes(self, device: DeviceSpec, category: str, nbytes: int) -> None:
        """Add ``nbytes`` bytes to ``device``'s ``category``."""
        name = resolve(device).name
        with self._lock:
            per_device = self.ledger.setdefault(
                name, dict.fromkeys(MEMORY_CATEGORIES, 0)
            )
            per_device[category] = per_device.get(category, 0) + nbytes

    def add_event(
        self, device: DeviceSpec, name: str, start: float, end: float
    ) -> None:
        """Record event ``name`` on ``device`` from ``start`` to ``end`` (seconds
        since the recorder was made)."""
        event = DeviceEvent(resolve(device).name, name, start, end)
        with self._lock:
            self._events.append(event)

    @contextmanager
    def span(self, device: DeviceSpec, name: str) -> Iterator[None]:
        """Record the time the ``with`` body takes as event ``name`` on ``device``."""
        start = self.now()
        try:
            yield
        finally:
            self.add_event(device, name, start, self.now())

    @property
    def events(self) -> list[DeviceEvent]:
        """Every recorded event (backward spans included), sorted by start time."""
        with self._lock:
            events = list(self._events)
            for s in self._backward_spans:
                if s.start is not None and s.end is not None:
                    events.append(DeviceEvent(s.device, "backward", s.start, s.end))
        return sorted(events, key=lambda e: (e.start, e.device))

    def duration(self) -> float:
        """Seconds from the first recorded event to the end of the last (06)."""
        events = self.events
        if not events:
            return 0.0
        return max(e.end for e in events) - min(e.start for e in events)

    def totals(self) -> dict[str, int]:
        """Bytes held per device, all categories together."""
        return {device: sum(c.values()) for device, c in self.ledger.items()}

    @property
    def peak(self) -> dict[str, int]:
        """The most bytes each device held at once while recording: every live
        storage, measured (03)."""
        return _by_device(self._memory.peak)

    @property
    def live(self) -> dict[str, int]:
        """Bytes each device holds now; after ``record_step``, what the step left
        behind (03)."""
        return _by_device(self._memory.live)

    def _backward_span(self, device: Device) -> _BackwardSpan:
        span = _BackwardSpan(self, device.name)
        with self._lock:
            self._backward_spans.append(span)
        return span


def _by_device(bytes_per_device: dict[str, int]) -> dict[str, int]:
    """The same dict, ordered "cpu", "gpu:0", "gpu:1", ..., "gpu:10"."""

    def order(name: str) -> tuple[str, int]:
        kind, _, number = name.partition(":")
        return kind, int(number) if number.isdigit() else -1

    return {d: bytes_per_device[d] for d in sorted(bytes_per_device, key=order)}


class _BackwardSpan:
    """A backward span filled in by autograd hooks, possibly from other threads."""

    def __init__(self, recorder: Recorder, device: str) -> None:
        self.recorder = recorder
        self.device = device
        self.start: float | None = None
        self.end: float | None = None

    def touch(self, _grad: torch.Tensor | None = None) -> None:
        now = self.recorder.now()
        with self.recorder._lock:
            self.start = now if self.start is None else min(self.start, now)
            self.end = now if self.end is None else max(self.end, now)


class _RecordedForward(nn.Module):
    """Calls ``module`` as DataParallel would and records that forward on
    ``device``: its time, the activations it saves, its output and the memory its
    ops allocate (in the thread it runs in), tagging its backward for ``device``."""

    def __init__(
        self,
        module: nn.Module,
        device: Device,
        recorder: Recorder,
        backward_span: _BackwardSpan | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.device = device
        self.recorder = recorder
        self.backward_span = backward_span

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        recorder, device = self.recorder, self.device
        with recorder._memory.on(device):
            start = recorder.now()
            with _catch_activations(
                recorder, device, self.module, args, kwargs
            ) as kept:
                output = self.module(*args, **kwargs)
                kept.append(output)
            recorder.add_event(device, "forward", start, recorder.now())
        recorder.hold(device, "outputs", output)
        recorder._memory.tag_backward(output, device)
        if self.backward_span is not None:  # the first gradient reaching the output
            for tensor in tensors_in(output):
                if tensor.requires_grad:
                    tensor.register_hook(self.backward_span.touch)
        return output


class RecordingDataParallel(DataParallel):
    """A ``DataParallel`` whose four steps are recorded by ``recorder`` (03, 06)."""

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[DeviceSpec] | None = None,
        output_device: DeviceSpec | None = None,
        dim: int = 0,
        recorder: Recorder | None = None,
    ) -> None:
        super().__init__(module, device_ids, output_device, dim)
        self.recorder = Recorder() if recorder is None else recorder
        # replica -> its backward span; replicas live for one forward
        self._backward_of: weakref.WeakKeyDictionary[nn.Module, _BackwardSpan] = (
            weakref.WeakKeyDictionary()
        )

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        module = self.module
        weights = [*module.parameters(), *module.buffers()]
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        self.recorder._memory.hold_resident([weights, grads])
        with self.recorder._memory.on(None):  # copies: charged to their targets
            if len(self.device_ids) > 1:
                return super().forward(*inputs, **kwargs)
            # One device: DataParallel calls the module itself, so record that call.
            self.recorder.hold(self.src_device, "parameters", weights)
            self.module = _RecordedForward(module, self.src_device, self.recorder)
            try:
                return super().forward(*inputs, **kwargs)
            finally:
                self.module = module

    def scatter(
        self,
        inputs: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        device_ids: Sequence[DeviceSpec],
    ) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
        recorder, targets = self.recorder, {}

        def moved(chunk: torch.Tensor, device: Device, start: float, end: float):
            recorder._memory.claim(chunk, device)
            recorder.hold(device, "inputs", chunk)
            targets[device.name] = device

        # PyTorch scatters with one call (comm.scatter) that copies every chunk:
        # one event, on every device that receives a chunk.
        start = recorder.now()
        with watch_moves(moved):
            scattered = super().scatter(inputs, kwargs, device_ids)
        end = recorder.now()
        for device in targets.values():
            recorder.add_event(device, "scatter", start, end)
        return scattered

    def replicate(
        self, module: nn.Module, device_ids: Sequence[DeviceSpec]
    ) -> list[nn.Module]:
        recorder, devices = self.recorder, [resolve(d) for d in device_ids]

        def copied(weight: torch.Tensor, device: Device, start: float, end: float):
            recorder._memory.claim(weight, device)

        # PyTorch copies all the weights to all the devices with one coalesced
        # broadcast (comm.broadcast_coalesced), then builds the replica modules:
        # one event, on every device.
        start = recorder.now()
        with watch_moves(copied):
            replicas = super().replicate(module, devices)
        end = recorder.now()
        for device, replica in zip(devices, replicas, strict=True):
            recorder.add_event(device, "replicate", start, end)
            weights = replica_weights(module, replica)
            recorder.hold(device, "parameters", weights)
            if torch.is_grad_enabled():  # replicas that backward will reach
                # the replicas' gradients are summed where the weights live
                recorder._memory.tag_backward(weights, self.src_device)
                span = recorder._backward_span(device)
                self._backward_of[replica] = span
                count = _gradient_counter(recorder, device)
                for weight in weights:  # the last gradient to reach the replica
                    if weight.requires_grad:
                        weight.register_hook(span.touch)
                        weight.register_hook(count)
        return replicas

    def parallel_apply(
        self, replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Any
    ) -> list[Any]:
        devices = self.device_ids[: len(replicas)]
        recorded = [
            _RecordedForward(
                replica, device, self.recorder, self._backward_of.get(replica)
            )
            for replica, device in zip(replicas, devices, strict=True)
        ]
        return super().parallel_apply(recorded, inputs, kwargs)

    def gather(self, outputs: Any, output_device: DeviceSpec) -> Any:
        device = resolve(output_device)
        with self.recorder._memory.on(device), self.recorder.span(device, "gather"):
            gathered = super().gather(outputs, device)
        self.recorder.hold(device, "gathered", gathered)
        self.recorder._memory.tag_backward(gathered, device)
        return gathered


def _gradient_counter(
    recorder: Recorder, device: Device
) -> Callable[[torch.Tensor], None]:
    """A tensor hook that adds each gradient it sees to the replica gradients."""

    def count(grad: torch.Tensor) -> None:
        recorder.hold(device, "replica gradients", grad)

    return count
