"""What each device holds and when it works: a memory ledger and a timeline.

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
  ``CATEGORIES``; ``recorder.totals()`` sums them per device;
- ``recorder.events``: ``Event(device, name, start, end)`` in seconds since the
  recorder was made, names "scatter", "replicate", "forward", "gather", "loss",
  "backward". A replica's backward is timed by autograd hooks, from the first
  gradient reaching its output to the last reaching its weights.

``recorder.hold(device, category, tensors)`` and ``with recorder.span(device,
name):`` add your own entries. Draw them with ``multigpu.plots.plot_memory`` and
``plot_timeline``.

What the ledger counts
----------------------
Every category is measured on the tensors themselves, nothing is estimated:

- "parameters": each replica's copy of the weights and buffers (on
  ``device_ids[0]`` the replica shares the model's own memory);
- "inputs": each device's chunk of the batch (and, from ``record_step``, the
  targets on ``output_device``);
- "activations": the tensors forward saves for backward, caught with
  ``torch.autograd.graph.saved_tensors_hooks`` in each replica's thread, counted
  once per storage and leaving out what is counted elsewhere (the replica's
  weights, inputs and outputs); on ``output_device`` also what the loss saves
  (cross-entropy keeps its log-softmax, as large as the gathered outputs);
- "outputs": each replica's output; "gathered": the outputs concatenated on
  ``output_device``; "loss": the loss value;
- "replica gradients": the gradients of each replica's weights, caught by hooks
  during backward. Every replica materialises a full set on its own device
  before they are summed (PyTorch's ``Broadcast.backward`` runs
  ``ReduceAddCoalesced`` once all of them exist);
- "gradients": the summed ``.grad`` of the model's parameters on
  ``device_ids[0]``.

The ledger adds up everything a step creates, as if nothing were freed (activations
are freed during backward, replica gradients once summed; afterwards only the
model's parameters and ``.grad`` remain, on ``device_ids[0]``). While recording, the
saved-tensor hooks replace any the caller set in the same thread, and they keep
autograd's check for tensors modified in place (with a shorter message).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn

from ..devices import Device
from .data_parallel import DataParallel
from .placement import (
    DeviceSpec,
    nbytes,
    place,
    resolve,
    tensors_in,
    to_device,
    watch_moves,
)
from .replicate import replica_weights

__all__ = ["CATEGORIES", "Event", "Recorder", "RecordingDataParallel", "record_step"]

CATEGORIES = (
    "parameters",  # each replica's weights and buffers
    "inputs",  # each device's chunk of the batch (+ the targets on output_device)
    "activations",  # tensors forward (and the loss) saved for backward
    "outputs",  # each replica's output
    "gathered",  # the outputs concatenated on output_device
    "loss",  # the loss value
    "replica gradients",  # each replica's weight gradients, before they are summed
    "gradients",  # the summed .grad of the model's parameters, on device_ids[0]
)


@dataclass(frozen=True)
class Event:
    """One span of work on one device; times in seconds since recording began."""

    device: str  # "gpu:0"
    name: str  # "scatter", "replicate", "forward", "gather", "loss", "backward"
    start: float
    end: float


class Recorder:
    """Bytes held per device (``ledger``) and timed ``events`` of the DataParallel
    steps run through ``recorder.watch(model)`` (03, 06)."""

    def __init__(self) -> None:
        self.ledger: dict[str, dict[str, int]] = {}  # device -> category -> bytes
        self._events: list[Event] = []
        self._backward_spans: list[_BackwardSpan] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

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
            per_device = self.ledger.setdefault(name, dict.fromkeys(CATEGORIES, 0))
            per_device[category] = per_device.get(category, 0) + nbytes

    def add_event(
        self, device: DeviceSpec, name: str, start: float, end: float
    ) -> None:
        """Record event ``name`` on ``device`` from ``start`` to ``end`` (seconds
        since the recorder was made)."""
        event = Event(resolve(device).name, name, start, end)
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
    def events(self) -> list[Event]:
        """Every recorded event (backward spans included), sorted by start time."""
        with self._lock:
            events = list(self._events)
            for s in self._backward_spans:
                if s.start is not None and s.end is not None:
                    events.append(Event(s.device, "backward", s.start, s.end))
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

    def _backward_span(self, device: Device) -> _BackwardSpan:
        span = _BackwardSpan(self, device.name)
        with self._lock:
            self._backward_spans.append(span)
        return span

    def _seconds(self, perf_counter_time: float) -> float:
        return perf_counter_time - self._t0


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


# ---------------------------------------------------------------------------
# Activations: what autograd saves for backward
# ---------------------------------------------------------------------------


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    """(an id of the memory ``tensor`` views, that memory's size in bytes)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):  # e.g. sparse tensors
        return id(tensor), tensor.numel() * tensor.element_size()


class _SavedTensors:
    """Catches, in the current thread only, every tensor autograd saves for
    backward: ``with saved.catch(): ...``; ``saved.storages``: id -> bytes."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        key, size = _storage(tensor)
        self.storages[key] = size
        return tensor, tensor._version  # kept as is: nothing is copied

    @staticmethod
    def _unpack(packed: tuple[torch.Tensor, int]) -> torch.Tensor:
        tensor, version = packed
        if tensor._version != version:  # the check autograd skips under hooks
            raise RuntimeError(
                "one of the variables needed for gradient computation has been "
                f"modified by an inplace operation: [{tensor.type()} "
                f"{list(tensor.shape)}] is at version {tensor._version}; expected "
                f"version {version} instead."
            )
        return tensor

    @contextmanager
    def catch(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def bytes_besides(self, *counted: Any) -> int:
        """Bytes saved, leaving out the memory of the tensors in ``counted``
        (tensors, containers of tensors, or modules: their weights and buffers)."""
        skip = {_storage(t)[0] for obj in counted for t in _tensors_of(obj)}
        return sum(n for key, n in self.storages.items() if key not in skip)


def _tensors_of(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``obj``; for a module (or a replica, whose weights are plain
    attributes) its parameters, buffers and tensor attributes."""
    if isinstance(obj, nn.Module):
        for module in obj.modules():
            for value in chain(
                module._parameters.values(),
                module._buffers.values(),
                vars(module).values(),
            ):
                if isinstance(value, torch.Tensor):  # skips None (e.g. no bias)
                    yield value
    else:
        yield from tensors_in(obj)


@contextmanager
def _catch_activations(
    recorder: Recorder, device: Device, *counted: Any
) -> Iterator[list[Any]]:
    """Count what the ``with`` body saves for backward as ``device``'s activations,
    leaving out ``counted`` and whatever the body appends to the yielded list."""
    results: list[Any] = []
    if not torch.is_grad_enabled():
        yield results
        return
    saved = _SavedTensors()
    with saved.catch():
        yield results
    recorder.hold_bytes(device, "activations", saved.bytes_besides(*counted, results))


# ---------------------------------------------------------------------------
# Recording DataParallel's steps from outside
# ---------------------------------------------------------------------------


class _RecordedForward(nn.Module):
    """Calls ``module`` as DataParallel would and records that forward on
    ``device``: its time, the activations it saves and its output."""

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
        start = recorder.now()
        with _catch_activations(recorder, device, self.module, args, kwargs) as kept:
            output = self.module(*args, **kwargs)
            kept.append(output)
        recorder.add_event(device, "forward", start, recorder.now())
        recorder.hold(device, "outputs", output)
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
        if len(self.device_ids) > 1:
            return super().forward(*inputs, **kwargs)
        # One device: DataParallel calls the module itself, so record that call.
        module = self.module
        weights = [*module.parameters(), *module.buffers()]
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
        recorder = self.recorder

        def moved(chunk: torch.Tensor, device: Device, start: float, end: float):
            recorder.add_event(
                device, "scatter", recorder._seconds(start), recorder._seconds(end)
            )
            recorder.hold(device, "inputs", chunk)

        with watch_moves(moved):
            return super().scatter(inputs, kwargs, device_ids)

    def replicate(
        self, module: nn.Module, device_ids: Sequence[DeviceSpec]
    ) -> list[nn.Module]:
        replicas = []
        for device in map(resolve, device_ids):  # one device at a time, timed
            with self.recorder.span(device, "replicate"):
                [replica] = super().replicate(module, [device])
            weights = replica_weights(module, replica)
            self.recorder.hold(device, "parameters", weights)
            if torch.is_grad_enabled():  # replicas that backward will reach
                span = self.recorder._backward_span(device)
                self._backward_of[replica] = span
                count = _gradient_counter(self.recorder, device)
                for weight in weights:  # the last gradient to reach the replica
                    if weight.requires_grad:
                        weight.register_hook(span.touch)
                        weight.register_hook(count)
            replicas.append(replica)
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
        with self.recorder.span(output_device, "gather"):
            gathered = super().gather(outputs, output_device)
        self.recorder.hold(output_device, "gathered", gathered)
        return gathered


def _gradient_counter(
    recorder: Recorder, device: Device
) -> Callable[[torch.Tensor], None]:
    """A tensor hook that adds each gradient it sees to the replica gradients."""

    def count(grad: torch.Tensor) -> None:
        recorder.hold(device, "replica gradients", grad)

    return count


def record_step(
    model: DataParallel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, Recorder]:
    """One training step (forward, loss on ``output_device``, backward) recorded:
    returns ``(loss, recorder)`` with the ledger and timeline (03, 06). The ledger
    sums every tensor the step creates, as if nothing were freed."""
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy
    recorder = Recorder()
    outputs = recorder.watch(model)(inputs)
    output_device = model.output_device
    targets = to_device(targets, output_device)
    recorder.hold(output_device, "inputs", targets)
    with (
        recorder.span(output_device, "loss"),
        _catch_activations(recorder, output_device, outputs, targets) as kept,
    ):
        loss = place(loss_fn(outputs, targets), output_device)
        kept.append(loss)
    recorder.hold(output_device, "loss", loss)
    start = recorder.now()
    loss.backward()
    if not recorder._backward_spans:  # one device: no replicas, one backward span
        recorder.add_event(model.src_device, "backward", start, recorder.now())
    grads = [p.grad for p in model.module.parameters() if p.grad is not None]
    recorder.hold(model.src_device, "gradients", grads)
    return loss, recorder
