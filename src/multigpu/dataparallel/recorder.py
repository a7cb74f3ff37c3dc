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
  ``CATEGORIES``; ``recorder.totals()`` sums them per device;
- ``recorder.peak``: device name -> the most bytes of tensors the device held at
  once, measured; ``recorder.live``: the bytes it holds now (after
  ``record_step``: what the step left behind);
- ``recorder.events``: ``Event(device, name, start, end)`` in seconds since the
  recorder was made, names "scatter", "replicate", "forward", "gather", "loss",
  "backward". As in PyTorch, scatter and replicate are each one call for all the
  devices (``comm.scatter``, ``comm.broadcast_coalesced``), so each is one span,
  drawn on every device it serves. A replica's backward is timed by autograd hooks,
  from the first gradient reaching its output to the last reaching its weights.

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

The ledger adds up what a step creates and keeps for a while, as if nothing were
freed: a breakdown by category, neither the peak nor a bound on it. It leaves out
the tensors that live only briefly (a convolution's output that its ReLU replaces,
the gradients of the activations during backward), which the peak includes.
While recording, the saved-tensor hooks replace any the caller set in the same
thread, and they keep autograd's check for tensors modified in place (with a
shorter message).

How the peak is measured
------------------------
A ``TorchDispatchMode`` sees the result of every op that the main thread and each
replica's thread run (modes belong to a thread, so each replica's thread enters
its own), forward and backward. Each new storage is charged to the device the
work is for: a copy's target (scatter, replicate, the targets), the replica's
device for its forward and backward, ``output_device`` for the gather and the
loss, ``device_ids[0]`` for the sum of the replicas' gradients (a gradient summed
in place becomes ``device_ids[0]``'s). Backward learns which device each node
works for from a pre-hook put on the node during forward. A weak-reference
finalizer on each storage reports its free, so ``peak`` is the largest total of
live storages per device; the model's weights, buffers and ``.grad`` are counted
from the start. What the peak leaves out: memory that kernels allocate and free
inside one op (convolution workspaces), and, on a real GPU, the caching
allocator's rounding and reserve. It measures this simulation, which differs from
PyTorch's DataParallel in two small ways: the gather's backward hands each replica
a view of the output gradient where a GPU would copy its chunk, and the replicas'
gradients are summed one weight at a time rather than in one coalesced
reduction. The dispatch mode slows every op down, so ``record_step(...,
track_memory=False)`` skips it when you time a step.
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
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from multigpu.core.devices import Device
from multigpu.dataparallel.data_parallel import DataParallel
from multigpu.dataparallel.placement import (
    DeviceSpec,
    device_of,
    nbytes,
    place,
    resolve,
    tensors_in,
    to_device,
    watch_moves,
)
from multigpu.dataparallel.replicate import replica_weights

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
    """What the DataParallel steps run through ``recorder.watch(model)`` create per
    device (``ledger``), the most each device holds at once (``peak``) and when
    each step runs (``events``) (03, 06). ``track_memory=False`` leaves out the
    peak, which slows every op down (06 times steps without it)."""

    def __init__(self, track_memory: bool = True) -> None:
        self.ledger: dict[str, dict[str, int]] = {}  # device -> category -> bytes
        self._events: list[Event] = []
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


# ---------------------------------------------------------------------------
# The measured peak: every storage a step allocates and frees, per device
# ---------------------------------------------------------------------------


class _Memory:
    """Live and peak bytes per device, measured on the storages themselves.

    A ``_TrackOps`` dispatch mode sees the outputs of every op the tracked threads
    run, forward and backward (modes are per thread: each replica's thread enters
    its own); a weak-reference finalizer on each new storage reports its free. A
    new storage is charged to the device the thread is working for (``on``, or a
    backward node's tag, see ``tag_backward``); where there is none (scatter and
    replicate run copies from the main thread) it waits until the copy's target
    ``claim``s it. A real CUDA storage is charged to its own device.
    """

    def __init__(self) -> None:
        self.live: dict[str, int] = {}  # device -> bytes held now
        self.peak: dict[str, int] = {}  # device -> the most bytes held at once
        self._owner: dict[int, tuple[str | None, int]] = {}  # id(storage) -> ...
        self._resident: set[int] = set()  # held before the step began
        self._finalizers: dict[int, weakref.finalize] = {}
        self._lock = threading.RLock()  # a finalizer may run inside a locked call
        self._thread = threading.local()  # .device, .tracking
        self.closed = False

    @contextmanager
    def on(self, device: Device | None) -> Iterator[None]:
        """Track the ops this thread runs in the ``with`` body, charging their new
        storages to ``device`` (None: to the target of the copy that claims them)."""
        local = self._thread
        previous = getattr(local, "device", None)
        mode = None
        if not getattr(local, "tracking", False) and not self.closed:
            mode = _TrackOps(self)
            mode.__enter__()
            local.tracking = True
        local.device = device
        try:
            yield
        finally:
            local.device = previous
            if mode is not None:
                local.tracking = False
                mode.__exit__(None, None, None)

    def _work_for(self, device: Device) -> None:
        self._thread.device = device

    def _charge(self, owner: str, nbytes: int) -> None:  # with the lock held
        live = self.live[owner] = self.live.get(owner, 0) + nbytes
        self.peak[owner] = max(self.peak.get(owner, 0), live)

    def _register(self, storage: torch.UntypedStorage, owner: str | None) -> None:
        key, nbytes = id(storage), storage.nbytes()
        self._owner[key] = (owner, nbytes)
        self._finalizers[key] = weakref.finalize(
            storage, _storage_freed, weakref.ref(self), key
        )
        if owner is not None:
            self._charge(owner, nbytes)

    def _owner_for(self, storage: torch.UntypedStorage) -> str | None:
        device = getattr(self._thread, "device", None)
        if device is not None and device.torch_device == storage.device:
            return device.name
        if storage.device.type == "cuda":  # a real GPU: its own device, exactly
            return str(storage.device)
        return None  # not yet known: charged when a copy claims it

    def saw(self, storage: torch.UntypedStorage, new: bool, written: bool) -> None:
        """An op returned ``storage``: ``new`` memory (not a view), or ``written``
        in place (summing a replica's gradient into it on ``device_ids[0]`` makes
        it ``device_ids[0]``'s)."""
        if self.closed:
            return
        with self._lock:
            known = self._owner.get(id(storage))
            if known is None:
                if new:  # a view of memory from before the step is not new
                    self._register(storage, self._owner_for(storage))
                return
            owner = self._owner_for(storage)
            if written and owner not in (None, known[0]):
                if id(storage) not in self._resident:
                    self._move(id(storage), owner)

    def _move(self, key: int, owner: str) -> None:  # with the lock held
        previous, nbytes = self._owner[key]
        if previous is not None:
            self.live[previous] -= nbytes
        self._owner[key] = (owner, nbytes)
        self._charge(owner, nbytes)

    def claim(self, tensor: torch.Tensor, device: Device) -> None:
        """``tensor`` is a copy made for ``device``: charge its new memory there."""
        storage = _untyped_storage(tensor)
        if storage is None or storage.device != device.torch_device:
            return
        with self._lock:
            known = self._owner.get(id(storage))
            if known is not None and known[0] != device.name:
                if id(storage) not in self._resident:
                    self._move(id(storage), device.name)

    def hold_resident(self, tensors: Any) -> None:
        """Count ``tensors`` (already on their devices) as held from the start."""
        if self.closed:
            return
        with self._lock:
            for tensor in tensors_in(tensors):
                storage = _untyped_storage(tensor)
                if storage is None or id(storage) in self._owner:
                    continue
                device = device_of(tensor)
                self._resident.add(id(storage))
                self._register(storage, device.name)

    def _free(self, key: int) -> None:
        with self._lock:
            owner, nbytes = self._owner.pop(key, (None, 0))
            self._finalizers.pop(key, None)
            self._resident.discard(key)
            if owner is not None:
                self.live[owner] -= nbytes

    def tag_backward(self, roots: Any, device: Device) -> None:
        """Charge what backward allocates, from the nodes that made ``roots`` back
        to the nodes already tagged, to ``device``: each node gets a pre-hook that
        tells the tracker which device the backward thread now works for."""
        if self.closed:
            return
        stack = [t.grad_fn for t in tensors_in(roots) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or _TAG in node.metadata or hasattr(node, "variable"):
                continue  # tagged already, or a leaf's AccumulateGrad
            node.metadata[_TAG] = device.name
            node.register_prehook(_WorkFor(self, device))
            stack.extend(next_node for next_node, _ in node.next_functions)

    def close(self) -> None:
        """Stop tracking: ``live`` keeps what was held at this moment."""
        with self._lock:
            self.closed = True
            for finalizer in self._finalizers.values():
                finalizer.detach()
            self._finalizers.clear()
            self._owner.clear()
            self._resident.clear()


_TAG = "multigpu device"  # key of a backward node's metadata: the device it runs for


class _WorkFor:
    """A backward node's pre-hook: from now on the backward thread works for
    ``device``."""

    def __init__(self, memory: _Memory, device: Device) -> None:
        self.memory = weakref.ref(memory)
        self.device = device

    def __call__(self, grad_outputs: Any) -> None:
        memory = self.memory()
        if memory is not None:
            memory._work_for(self.device)


def _storage_freed(memory: weakref.ref[_Memory], key: int) -> None:
    tracker = memory()
    if tracker is not None:
        tracker._free(key)


def _untyped_storage(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    if tensor.device.type == "meta":
        return None
    try:
        return tensor.untyped_storage()
    except (NotImplementedError, RuntimeError):  # sparse, nested, ...
        return None


class _TrackOps(TorchDispatchMode):
    """Reports every op's output storages to ``memory`` (in the thread it is
    entered in)."""

    def __init__(self, memory: _Memory) -> None:
        super().__init__()
        self.memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        values = out if len(returns) > 1 else (out,)
        for value, schema in zip(values, returns, strict=False):
            alias = schema.alias_info  # views and in-place results alias an input
            for tensor in tree_leaves(value):
                if isinstance(tensor, torch.Tensor):
                    storage = _untyped_storage(tensor)
                    if storage is not None:
                        self.memory.saw(
                            storage, alias is None, alias is not None and alias.is_write
                        )
        return out


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


def record_step(
    model: DataParallel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    track_memory: bool = True,
) -> tuple[torch.Tensor, Recorder]:
    """One training step (forward, loss on ``output_device``, backward) recorded:
    returns ``(loss, recorder)`` with the ledger, the measured peak per device and
    the timeline (03, 06). The ledger sums every tensor the step creates, as if
    nothing were freed; ``recorder.peak`` is the most each device held at once.
    ``track_memory=False`` skips the peak, which slows every op down: use it when
    you time the step (06)."""
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy
    recorder = Recorder(track_memory)
    memory = recorder._memory
    output_device = model.output_device
    # a batch already on a device is held there from the start, as on a GPU
    memory.hold_resident(
        [t for t in tensors_in([inputs, targets]) if device_of(t).name != "cpu"]
    )
    with memory.on(None):
        outputs = recorder.watch(model)(inputs)
        with memory.on(output_device):
            targets = to_device(targets, output_device)
            recorder.hold(output_device, "inputs", targets)
            with (
                recorder.span(output_device, "loss"),
                _catch_activations(recorder, output_device, outputs, targets) as kept,
            ):
                loss = place(loss_fn(outputs, targets), output_device)
                kept.append(loss)
            recorder.hold(output_device, "loss", loss)
            memory.tag_backward(loss, output_device)
            del outputs, targets, kept  # backward frees what nothing else holds
            start = recorder.now()
            loss.backward()
    if not recorder._backward_spans:  # one device: no replicas, one backward span
        recorder.add_event(model.src_device, "backward", start, recorder.now())
    grads = [p.grad for p in model.module.parameters() if p.grad is not None]
    recorder.hold(model.src_device, "gradients", grads)
    for grad in grads:  # the summed gradients live with the parameters
        memory.claim(grad, model.src_device)
    del grads
    memory.close()
    return loss, recorder
