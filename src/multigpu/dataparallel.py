"""nn.DataParallel opened up: scatter, replicate, parallel_apply and gather by hand.

Taught in ``notebooks/02_dataparallel_under_the_hood.ipynb`` and used by the
pitfall notebooks 03-06.

``torch.nn.DataParallel`` runs one process that, on every forward, (1) *scatters*
the batch into chunks, one per device, (2) *replicates* the module onto every
device, (3) runs the replicas in threads (*parallel_apply*) and (4) *gathers* the
outputs onto ``output_device``. Backward runs through the same graph, so every
replica's gradients are summed into the original module's parameters.

PyTorch's versions of these four steps refuse CPU devices, and without CUDA
``nn.DataParallel`` silently calls the module unchanged. The functions here have
the same signatures and semantics as ``torch.nn.parallel``'s, but work on any list
of devices, including *simulated* ones ("gpu:0", "gpu:1", ... from
``multigpu.devices.simulated_devices``) that all compute on the CPU. On real CUDA
devices they run on the GPUs for real.

Public API
----------
- ``scatter(inputs, target_gpus, dim=0)``: tensors -> ``tensor.chunk(n, dim)``
  (``ceil(B/n)`` rows each, possibly fewer than n chunks), one copy per device;
  non-tensors copied by reference once per device; tuples, lists, dicts and
  namedtuples rebuilt with ``zip`` (cut to the shortest). A lone tensor gives a
  tuple, anything else a list (as in PyTorch).
- ``scatter_kwargs(inputs, kwargs, target_gpus, dim=0) -> (inputs, kwargs)``:
  tuples of per-device positional tuples and keyword dicts, padded like PyTorch:
  more keyword dicts than positional tuples -> positional padded with ``()``;
  else fewer keyword dicts than ``len(inputs)`` (the *unscattered* inputs) ->
  keywords padded with ``{}``.
- ``replicate(network, devices, detach=False) -> list[Module]``: one replica per
  device. Parameters are copied with differentiable ops (on the device that holds
  them already, a view sharing storage), so ``backward`` sums each replica's
  gradients into the original parameters.
- ``parallel_apply(modules, inputs, kwargs_tup=None, devices=None) -> list``:
  each replica in its own thread; an exception is re-raised in the caller as
  ``Caught TypeError in replica 3 on device gpu:3.`` plus the original message
  (the original exception, with its full traceback, is chained as ``__cause__``
  rather than pasted into the message, so the message stays the same on every
  machine).
- ``gather(outputs, target_device, dim=0)``: ``torch.cat`` on ``target_device``;
  0-dim outputs gathered along dim 0 become a vector with PyTorch's warning.
- ``DataParallel(module, device_ids=None, output_device=None, dim=0)``: the
  ``nn.Module`` wrapper built from the four steps, same ``forward`` logic as
  PyTorch's (the ``device_ids[0]`` check and its error text, one device id ->
  module called directly, replicas ``device_ids[:len(inputs)]``, ``output_device``
  defaulting to ``device_ids[0]``, ``module.`` prefix in ``state_dict``).
  ``device_ids`` may hold ``Device`` objects, "gpu:N", "cuda:N", ints (CUDA ids)
  or ``torch.device``; ``dp.device_ids`` and ``dp.output_device`` are ``Device``.
  Unlike PyTorch, it never falls back silently: no ``device_ids`` on a machine
  without CUDA, an empty list or an unknown device is a ``ValueError``.
- ``to_device(tensor_or_module, device)`` and ``device_of(tensor) -> Device``:
  placement on simulated devices (see below). ``scatter_sizes(batch, n)``: the chunk
  sizes ``scatter`` produces.
- Recording: ``with Recorder() as rec: ...`` records, for every step run inside
  it, the bytes each device holds (``rec.ledger``: device name -> category ->
  bytes, categories in ``CATEGORIES``) and timed events (``rec.events``: list of
  ``Event(device, name, start, end)``, seconds since the recorder started; names
  "scatter", "replicate", "forward", "gather", "loss", "backward"; a replica's
  backward is timed by autograd hooks, from the first gradient reaching its output
  to the last reaching its weights). ``rec.hold(device, category, tensors)`` and
  ``with rec.span(device, name):`` add your own entries; ``rec.totals()`` sums
  the ledger per device.
  ``record_step(dp, inputs, targets, loss_fn)`` runs one full step (forward, loss,
  backward) under a new recorder and returns ``(loss, recorder)``. Draw them with
  ``multigpu.plots.plot_memory`` and ``plot_timeline``.

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

The ledger adds up everything a step creates, as if nothing were freed: an upper
bound on each device's peak, not what it holds after the step (activations are
freed during backward, replica gradients once summed; afterwards only the model's
parameters and ``.grad`` remain, on ``device_ids[0]``). While recording, the
saved-tensor hooks replace any the caller set in the same thread, and they keep
autograd's check for tensors modified in place (with a shorter message).

How simulated placement is tracked
----------------------------------
A simulated device stores its tensors on the CPU, so ``tensor.device`` cannot say
which simulated GPU a tensor belongs to. A weak registry (a
``torch.utils.weak.WeakIdKeyDictionary``, so it never keeps a tensor alive) maps
tensors to the ``Device`` they were placed on. ``to_device`` and the four steps
write to it; ``device_of`` reads it and falls back to ``tensor.device``
("cpu" or "cuda:N") for tensors it does not know, including new tensors you
compute from simulated ones outside the four steps (place them with
``to_device`` if you need to). Moving a tensor between two *different*
simulated devices makes a real copy (``clone``), as a transfer between GPUs
would; on the device it already lives on, nothing is copied.
``to_device(module, device)`` moves a module in place, like ``module.to``, its
parameters' ``.grad`` included. It also gives each parameter a hook
(``register_post_accumulate_grad_hook``) that places a new ``.grad`` on the
parameter's device after every backward, so ``device_of(param.grad)`` answers
like ``param.grad.device`` does on a real GPU. Use ``to_device`` rather than
``module.to("cpu")`` to move a module off a simulated device: ``.to`` does not
know about the registry.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .devices import Device, cuda_device_count, resolve_device

__all__ = [
    "CATEGORIES",
    "DataParallel",
    "Event",
    "Recorder",
    "scatter_sizes",
    "device_of",
    "gather",
    "parallel_apply",
    "record_step",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "to_device",
]

DeviceSpec = Device | torch.device | str | int

# ---------------------------------------------------------------------------
# Placement: which (possibly simulated) device a tensor lives on
# ---------------------------------------------------------------------------

_placement: WeakIdKeyDictionary = WeakIdKeyDictionary()
_placement_lock = threading.Lock()


def _resolve(spec: DeviceSpec) -> Device:
    """Like ``resolve_device``, and -1 means the CPU (as in ``gather``)."""
    if isinstance(spec, int) and not isinstance(spec, bool) and spec == -1:
        return resolve_device("cpu")
    return resolve_device(spec)


def _place(tensor: torch.Tensor, device: Device) -> torch.Tensor:
    with _placement_lock:
        _placement[tensor] = device
    return tensor


def _unplaced(tensor: torch.Tensor) -> bool:
    with _placement_lock:
        return tensor not in _placement


def device_of(tensor: torch.Tensor) -> Device:
    """The device ``tensor`` was placed on: a simulated "gpu:N", else its real
    ``tensor.device`` as a ``Device`` (02, 03)."""
    with _placement_lock:
        device = _placement.get(tensor)
    if device is not None and device.torch_device == tensor.device:
        return device
    return Device(str(tensor.device), tensor.device)


def _move(tensor: torch.Tensor, source: Device, target: Device) -> torch.Tensor:
    """``tensor`` (living on ``source``) as a tensor on ``target``; differentiable."""
    if source.name == target.name:
        moved = tensor  # already there: no copy, as ``Tensor.to`` does
    elif source.torch_device == target.torch_device:
        moved = tensor.clone()  # between simulated devices: a real copy
    else:
        moved = tensor.to(target.torch_device)
    return _place(moved, target)


_grad_hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> True


def _place_grad(param: torch.Tensor) -> None:
    """After backward: ``param.grad`` lives where ``param`` lives, as on a GPU."""
    if param.grad is not None:
        device = device_of(param)
        if device.simulated:
            _place(param.grad, device)


def _track_grads(param: torch.Tensor) -> None:
    """Hook ``param`` once so that every new ``.grad`` is placed with it."""
    with _placement_lock:
        if param in _grad_hooked or not param.is_leaf:
            return
        _grad_hooked[param] = True
    param.register_post_accumulate_grad_hook(_place_grad)


def to_device(obj: torch.Tensor | nn.Module, device: DeviceSpec) -> Any:
    """``obj.to(device)`` that understands simulated devices: a module is moved in
    place (gradients too) and returned, a tensor is returned on ``device`` (02, 03)."""
    target = _resolve(device)
    if isinstance(obj, nn.Module):
        obj.to(target.torch_device)
        for tensor in chain(obj.parameters(), obj.buffers()):
            _place(tensor, target)
        for param in obj.parameters():
            _track_grads(param)
            if param.grad is not None:
                _place(param.grad, target)
        return obj
    if isinstance(obj, torch.Tensor):
        return _move(obj, device_of(obj), target)
    raise TypeError(
        f"to_device moves a tensor or an nn.Module, got {type(obj).__name__}. "
        "Move the tensors inside it one by one."
    )


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj`` (tensors, lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _check_devices(devices: Sequence[DeviceSpec], what: str) -> list[Device]:
    if isinstance(devices, (str, Device, torch.device, int)):
        raise TypeError(
            f"{what} needs a list of devices, got the single device {devices!r}. "
            "Wrap it in a list, e.g. [devices[0]]."
        )
    resolved = [_resolve(d) for d in devices]
    if not resolved:
        raise ValueError(
            f"{what} got an empty list of devices. Pass at least one, e.g. "
            "multigpu.devices.simulated_devices(2)."
        )
    return resolved


# ---------------------------------------------------------------------------
# Recording: bytes per device and a timeline of events
# ---------------------------------------------------------------------------

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


class _Span:
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
        key, nbytes = _storage(tensor)
        self.storages[key] = nbytes
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
        yield from _tensors(obj)


@contextmanager
def _catch_activations(
    recorder: Recorder | None, device: Device, *counted: Any
) -> Iterator[list[Any]]:
    """Count what the ``with`` body saves for backward as ``device``'s activations,
    leaving out ``counted`` and whatever the body appends to the yielded list."""
    results: list[Any] = []
    if recorder is None or not torch.is_grad_enabled():
        yield results
        return
    saved = _SavedTensors()
    with saved.catch():
        yield results
    recorder.hold_bytes(device, "activations", saved.bytes_besides(*counted, results))


_recorders: list[Recorder] = []


def _active() -> Recorder | None:
    return _recorders[-1] if _recorders else None


class Recorder:
    """Records bytes held per device (``ledger``) and timed ``events`` for every
    DataParallel step run inside ``with Recorder() as rec:`` (03, 06)."""

    def __init__(self) -> None:
        self.ledger: dict[str, dict[str, int]] = {}  # device -> category -> bytes
        self._events: list[Event] = []
        self._spans: list[_Span] = []
        self._replica_spans: weakref.WeakKeyDictionary[nn.Module, _Span] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def __enter__(self) -> Recorder:
        self._t0 = time.perf_counter()
        _recorders.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _recorders.remove(self)

    def now(self) -> float:
        """Seconds since the recorder started."""
        return time.perf_counter() - self._t0

    def hold(self, device: DeviceSpec, category: str, obj: Any) -> None:
        """Add the bytes of every tensor in ``obj`` to ``device``'s ``category``."""
        self.hold_bytes(device, category, _nbytes(obj))

    def hold_bytes(self, device: DeviceSpec, category: str, nbytes: int) -> None:
        """Add ``nbytes`` bytes to ``device``'s ``category``."""
        name = _resolve(device).name
        with self._lock:
            per_device = self.ledger.setdefault(name, dict.fromkeys(CATEGORIES, 0))
            per_device[category] = per_device.get(category, 0) + nbytes

    @contextmanager
    def span(self, device: DeviceSpec, name: str) -> Iterator[None]:
        """Record the time the ``with`` body takes as event ``name`` on ``device``."""
        device_name = _resolve(device).name
        start = self.now()
        try:
            yield
        finally:
            end = self.now()
            with self._lock:
                self._events.append(Event(device_name, name, start, end))

    @property
    def events(self) -> list[Event]:
        """Every recorded event (backward spans included), sorted by start time."""
        with self._lock:
            events = list(self._events)
            for s in self._spans:
                if s.start is not None and s.end is not None:
                    events.append(Event(s.device, "backward", s.start, s.end))
        return sorted(events, key=lambda e: (e.start, e.device))

    def totals(self) -> dict[str, int]:
        """Bytes held per device, all categories together."""
        return {device: sum(c.values()) for device, c in self.ledger.items()}


@contextmanager
def _span(device: Device, name: str) -> Iterator[None]:
    recorder = _active()
    if recorder is None:
        yield
    else:
        with recorder.span(device, name):
            yield


def _hold(device: Device, category: str, obj: Any) -> None:
    recorder = _active()
    if recorder is not None:
        recorder.hold(device, category, obj)


# ---------------------------------------------------------------------------
# The four steps
# ---------------------------------------------------------------------------


def _is_namedtuple(obj: Any) -> bool:
    fields = hasattr(obj, "_asdict") and hasattr(obj, "_fields")
    return isinstance(obj, tuple) and fields


def scatter_sizes(batch_size: int, device_count: int) -> list[int]:
    """Rows per chunk when ``scatter`` splits ``batch_size`` rows over
    ``device_count`` devices: ``tensor.chunk`` sizes, ceil(B/n) each (04)."""
    return [len(c) for c in torch.empty(batch_size).chunk(device_count)]


def _scatter_tensor(
    tensor: torch.Tensor, devices: list[Device], dim: int
) -> tuple[torch.Tensor, ...]:
    source = device_of(tensor)
    chunks = tensor.chunk(len(devices), dim)
    moved = []
    for chunk, device in zip(chunks, devices, strict=False):
        with _span(device, "scatter"):
            moved.append(_move(chunk, source, device))
        _hold(device, "inputs", moved[-1])
    return tuple(moved)


def scatter(inputs: Any, target_gpus: Sequence[DeviceSpec], dim: int = 0) -> Any:
    """Split tensors into ``tensor.chunk(len(target_gpus), dim)`` pieces, one per
    device; copy references to anything else once per device (02, 04)."""
    devices = _check_devices(target_gpus, "scatter")

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return _scatter_tensor(obj, devices, dim)
        # Containers: scatter every entry, then regroup per device with zip,
        # which stops at the shortest entry (strict=False, as in PyTorch).
        if _is_namedtuple(obj):
            per_entry = map(scatter_map, obj)
            return [type(obj)(*args) for args in zip(*per_entry, strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            per_item = map(scatter_map, obj.items())
            return [type(obj)(i) for i in zip(*per_item, strict=False)]
        # Anything else (numbers, strings, None, empty containers): the same
        # object once per device, not a copy.
        return [obj for _ in devices]

    try:
        return scatter_map(inputs)
    finally:
        scatter_map = None  # break the closure's reference cycle, as PyTorch does


def scatter_kwargs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    target_gpus: Sequence[DeviceSpec],
    dim: int = 0,
) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """``scatter`` positional and keyword inputs, then pad the shorter list like
    PyTorch: extra ``()`` or ``{}`` entries (02, 04)."""
    _check_devices(target_gpus, "scatter_kwargs")
    scattered_inputs = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(
            () for _ in range(len(scattered_kwargs) - len(scattered_inputs))
        )
    elif len(scattered_kwargs) < len(inputs):  # len(inputs), as in PyTorch
        scattered_kwargs.extend(
            {} for _ in range(len(scattered_inputs) - len(scattered_kwargs))
        )
    return tuple(scattered_inputs), tuple(scattered_kwargs)


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
                copy = _move(copy, source, device)
        elif source.name == device.name:
            copy = tensor.view_as(tensor)  # shares storage, grads flow back
        else:
            copy = _move(tensor, source, device)
        copies.append(_place(copy, device))
    return copies


def _replicate_one(
    network: nn.Module, device: Device, detach: bool
) -> tuple[nn.Module, list[torch.Tensor]]:
    """One replica of ``network`` on ``device``, and its differentiable weights."""
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
    _hold(device, "parameters", list(copy_of.values()))

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
    weights = [copy_of[t] for t in params + differentiable]
    return module_copies[network], weights


def replicate(
    network: nn.Module, devices: Sequence[DeviceSpec], detach: bool = False
) -> list[nn.Module]:
    """One replica of ``network`` per device; gradients flow back to ``network``'s
    parameters unless ``detach`` (02)."""
    if not devices:
        return []
    targets = _check_devices(devices, "replicate")
    recorder = _active()
    replicas = []
    for device in targets:
        with _span(device, "replicate"):
            replica, weights = _replicate_one(network, device, detach)
        replicas.append(replica)
        if recorder is not None and not detach:
            # time this replica's backward: from the first gradient that reaches
            # its output (see parallel_apply) to the last one reaching its weights
            span = _Span(recorder, device.name)
            with recorder._lock:
                recorder._spans.append(span)
                recorder._replica_spans[replica] = span
            count_gradient = _counter(recorder, device, "replica gradients")
            for weight in weights:
                if weight.requires_grad:
                    weight.register_hook(span.touch)
                    weight.register_hook(count_gradient)
    return replicas


def _counter(
    recorder: Recorder, device: Device, category: str
) -> Callable[[torch.Tensor], None]:
    """A tensor hook that adds the bytes of each gradient it sees to the ledger."""

    def count(grad: torch.Tensor) -> None:
        recorder.hold(device, category, grad)

    return count


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
            None if d is None else _resolve(d) for d in devices
        ]
    else:
        targets = [None] * len(modules)
    recorder = _active()
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
        torch.set_grad_enabled(grad_enabled)
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
                start = recorder.now() if recorder else 0.0
                counted = (module, input, kwargs)
                with _catch_activations(recorder, device, *counted) as kept:
                    output = module(*input, **kwargs)
                    kept.append(output)
            for tensor in _tensors(output):
                if _unplaced(tensor):  # a new tensor computed on this device
                    _place(tensor, device)
            if recorder is not None:
                with recorder._lock:
                    recorder._events.append(
                        Event(device.name, "forward", start, recorder.now())
                    )
                recorder.hold(device, "outputs", output)
                span = recorder._replica_spans.get(module)
                if span is not None:
                    for tensor in _tensors(output):
                        if tensor.requires_grad:
                            tensor.register_hook(span.touch)
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


def _gather_tensors(
    tensors: Sequence[torch.Tensor], target: Device, dim: int
) -> torch.Tensor:
    if all(t.dim() == 0 for t in tensors) and dim == 0:
        tensors = [t.view(1) for t in tensors]
        warnings.warn(
            "Was asked to gather along dimension 0, but all "
            "input tensors were scalars; will instead unsqueeze "
            "and return a vector.",
            stacklevel=2,
        )
    with _span(target, "gather"):
        gathered = torch.cat([t.to(target.torch_device) for t in tensors], dim)
    _hold(target, "gathered", gathered)
    return _place(gathered, target)


def gather(outputs: Any, target_device: DeviceSpec, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs along ``dim`` on ``target_device``
    (-1 or "cpu" for the CPU); containers are gathered entry by entry (02, 05)."""
    if len(outputs) == 0:
        raise ValueError(
            "gather got no outputs to gather. Pass one output per replica, as "
            "returned by parallel_apply."
        )
    target = _resolve(target_device)

    def gather_map(outputs: Any) -> Any:
        out = outputs[0]
        if isinstance(out, torch.Tensor):
            return _gather_tensors(outputs, target, dim)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outputs):
                raise ValueError("All dicts must have the same number of keys")
            return type(out)((k, gather_map([d[k] for d in outputs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outputs, strict=True)))
        return type(out)(map(gather_map, zip(*outputs, strict=True)))

    try:
        return gather_map(outputs)
    finally:
        gather_map = None  # break the closure's reference cycle, as PyTorch does


# ---------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------


class DataParallel(nn.Module):
    """``nn.DataParallel`` rebuilt from scatter, replicate, parallel_apply and
    gather; works on simulated devices as well as real GPUs (02-06)."""

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
                    "device_ids=multigpu.devices.simulated_devices(2)."
                )
            device_ids = list(range(cuda_device_count()))
        self.dim = dim
        self.module = module
        self.device_ids: list[Device] = _check_devices(device_ids, "DataParallel")
        self.output_device: Device = (
            self.device_ids[0] if output_device is None else _resolve(output_device)
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
            _hold(self.src_device, "parameters", self._weights())
            counted = (self.module, inputs[0], module_kwargs[0])
            with (
                _span(self.src_device, "forward"),
                _catch_activations(_active(), self.src_device, *counted) as kept,
            ):
                output = self.module(*inputs[0], **module_kwargs[0])
                kept.append(output)
            _hold(self.src_device, "outputs", output)
            return output
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def _weights(self) -> list[torch.Tensor]:
        return [*self.module.parameters(), *self.module.buffers()]

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


def record_step(
    model: DataParallel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, Recorder]:
    """One training step (forward, loss on ``output_device``, backward) recorded:
    returns ``(loss, recorder)`` with the ledger and timeline (03, 06). The ledger
    sums every tensor the step creates: an upper bound on each device's peak."""
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy
    output_device = model.output_device
    with Recorder() as recorder:
        outputs = model(inputs)
        targets = to_device(targets, output_device)
        recorder.hold(output_device, "inputs", targets)
        with (
            recorder.span(output_device, "loss"),
            _catch_activations(recorder, output_device, outputs, targets) as kept,
        ):
            loss = _place(loss_fn(outputs, targets), output_device)
            kept.append(loss)
        recorder.hold(output_device, "loss", loss)
        start = recorder.now()
        loss.backward()
        if not recorder._spans:  # one device: no replicas, one backward span
            with recorder._lock:
                recorder._events.append(
                    Event(model.src_device.name, "backward", start, recorder.now())
                )
        grads = [p.grad for p in model.module.parameters() if p.grad is not None]
        recorder.hold(model.src_device, "gradients", grads)
    return loss, recorder
