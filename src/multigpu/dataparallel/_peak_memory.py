"""The measured peak: every storage a recorded step allocates and frees, per
device (03).

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
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from multigpu.core.devices import Device
from multigpu.dataparallel.placement import device_of, tensors_in


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
