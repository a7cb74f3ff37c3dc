"""The wrappers of the ladder's first two steps and what all three share (10).

:class:`MiniDDP` holds what every step of the ladder shares, as DDP does it: rank
0's parameters and buffers are broadcast when the wrapper is built, buffers again
before every forward; gradients are divided by the world size and summed, so they
become the mean over the ranks; ``no_sync()`` skips the communication (decided in
``forward``, like DDP); a parameter that received no gradient is an error
(:class:`UnusedParameterError`), unless ``find_unused_parameters=True``, which pays
for a walk over the autograd graph after every forward and one more all-reduce.

The end of backward is found the way DDP finds it: the first gradient hook of a
backward pass queues a callback that the autograd engine runs once the whole pass
is done (``Variable._execution_engine.queue_callback``, what
``torch/nn/parallel/distributed.py`` uses). So, like DDP, the wrappers need no
extra call: ``loss.backward()`` returns with averaged gradients.

- :class:`AfterBackwardDDP`: once backward has finished, one all-reduce per
  parameter (08's idea, a message per tensor);
- :class:`FlatDDP`: once backward has finished, one all-reduce of every gradient
  packed into one flat buffer (08's ``average_gradients``).

The third step, :class:`~multigpu.miniddp.buckets.BucketedDDP`, is in ``buckets.py``.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from multigpu.miniddp.timeline import TimelineEvent


class UnusedParameterError(RuntimeError):
    """A parameter got no gradient in a backward pass that all-reduces (10)."""


def broadcast_from_rank0(tensors: Iterator[torch.Tensor]) -> None:
    """Overwrite every tensor with rank 0's values, in place (10)."""
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)


def copy_from_rank0(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers hold rank 0's values on
    every rank, as DDP's constructor makes them; ``model`` is left as it was. Where
    the wrappers by hand start (10; 13, 14, 14b)."""
    model = copy.deepcopy(model)
    broadcast_from_rank0(t for t in (*model.parameters(), *model.buffers()))
    return model


def used_parameters(outputs: Any) -> set[int]:
    """The ``id`` of every leaf tensor that the autograd graph of ``outputs``
    reaches: the parameters that backward will give a gradient. A walk over the
    graph, what ``find_unused_parameters=True`` costs after every forward (10)."""
    roots = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    seen: set = set()
    found: set[int] = set()
    while roots:
        node = roots.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad: the end of a path, a leaf
            found.add(id(node.variable))
        roots.extend(next_node for next_node, _ in node.next_functions)
    return found


def _tensors(outputs: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) output of a model."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return [t for item in outputs for t in _tensors(item)]
    return []


class MiniDDP(nn.Module):
    """What every step of the ladder shares; subclasses say when gradients travel.

    A subclass implements :meth:`gradient_ready` (a parameter's gradient has just
    been accumulated; may start communication) and :meth:`synchronize` (backward
    has finished: finish communication, leave the mean gradient in every ``.grad``).
    """

    def __init__(
        self,
        module: nn.Module,
        find_unused_parameters: bool = False,
        record: bool = False,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                f"{type(self).__name__} needs a process group: call "
                "dist.init_process_group(...) first (spawn and torchrun do it)."
            )
        self.module = module
        self.world_size = dist.get_world_size()
        self.find_unused_parameters = find_unused_parameters
        self.record = record
        self.require_backward_grad_sync = True  # no_sync() sets it to False
        self.named_params = [
            (name, p) for name, p in module.named_parameters() if p.requires_grad
        ]
        if not self.named_params:
            raise ValueError(
                f"{type(self).__name__} got a model with no parameter that requires "
                "a gradient, so there is nothing to all-reduce. Wrap a model with "
                "trainable parameters, or train this one without a wrapper."
            )
        self.events: list[TimelineEvent] = []
        self._sync_this_backward = False  # decided in forward, as DDP does
        self._callback_queued = False
        self._ready: set[int] = set()  # ids of params whose gradient is in
        self._unused: set[int] = set()  # ids found unused after this forward
        self._got_gradient: set[int] = set()  # ids with a gradient since last sync
        self._t0 = 0.0
        self._last_ready = 0.0
        broadcast_from_rank0(
            t for t in (*module.parameters(), *module.buffers())
        )  # every rank starts from rank 0's weights
        for _, p in self.named_params:
            p.register_post_accumulate_grad_hook(self._on_gradient)

    # -- what a subclass decides ------------------------------------------------
    def gradient_ready(self, param: nn.Parameter) -> None:
        """``param.grad`` now holds this backward's gradient (summed with any from
        ``no_sync`` steps). Nothing to do until backward ends, by default."""

    def synchronize(self) -> None:
        """Backward has finished: leave the mean over the ranks in every ``.grad``."""
        raise NotImplementedError

    # -- forward and the end of backward ----------------------------------------
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._t0 = time.perf_counter()
        self.events = []
        self._sync_this_backward = self.require_backward_grad_sync and (
            torch.is_grad_enabled() and self.training
        )
        self._callback_queued = False
        self._ready = set()
        for buffer in self.module.buffers():  # DDP's default: rank 0's buffers
            dist.broadcast(buffer, src=0)
        outputs = self.module(*inputs, **kwargs)
        self._unused = set()
        if self._sync_this_backward and self.find_unused_parameters:
            used = used_parameters(outputs)
            self._unused = {id(p) for _, p in self.named_params if id(p) not in used}
        if self.record:
            now = self._now()
            self.events.append(TimelineEvent("backward", "forward", 0.0, now))
            for t in _tensors(outputs):
                if t.requires_grad:  # fires when backward reaches the output
                    t.register_hook(self._backward_started)
                    break
        return outputs

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes whose forward runs inside only accumulate ``.grad``."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _on_gradient(self, param: nn.Parameter) -> None:
        self._got_gradient.add(id(param))  # no_sync steps count too, as in DDP
        if not self._sync_this_backward:
            return
        if not self._callback_queued:
            Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
            for _, p in self.named_params:  # unused ones are ready from the start
                if id(p) in self._unused:
                    self._ready.add(id(p))
                    self.gradient_ready(p)
        if self.record:
            now = self._now()
            self.events.append(
                TimelineEvent("backward", self._layer_of(param), self._last_ready, now)
            )
            self._last_ready = now
        self._ready.add(id(param))
        self.gradient_ready(param)

    def _end_of_backward(self) -> None:
        missing = [name for name, p in self.named_params if id(p) not in self._ready]
        if missing:
            raise UnusedParameterError(
                f"{len(missing)} parameter(s) received no gradient in this backward "
                f"pass: {', '.join(missing)}. Their gradients can never be "
                "all-reduced, so the other ranks would wait for them forever. Make "
                "every parameter take part in the loss, or pass "
                "find_unused_parameters=True (it costs a walk over the autograd graph "
                "after every forward and one more all-reduce)."
            )
        start = self._now()
        self.synchronize()
        if self.find_unused_parameters:
            self._keep_unused_grads_as_ddp_does()
        if self.record:
            self.events.append(TimelineEvent("backward", "sync", start, self._now()))

    def _keep_unused_grads_as_ddp_does(self) -> None:
        """A parameter that no rank used since the last synchronization (this
        backward and the ``no_sync`` ones before it) keeps ``grad=None`` (DDP's
        rule); one that some rank used gets the mean gradient. One more all-reduce,
        of a 0/1 map."""
        used = torch.tensor(
            [float(id(p) in self._got_gradient) for _, p in self.named_params]
        )
        self._got_gradient = set()
        dist.all_reduce(used)
        for (_, p), count in zip(self.named_params, used.tolist()):
            if count == 0:
                p.grad = None

    # -- the timeline ----------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _backward_started(self, grad: torch.Tensor) -> None:
        self._last_ready = self._now()

    def _layer_of(self, param: nn.Parameter) -> str:
        name = next(n for n, p in self.named_params if p is param)
        return name.rsplit(".", 1)[0]

    def _timed_all_reduce(self, tensor: torch.Tensor, name: str) -> Any:
        """Start ``all_reduce(tensor)`` (a sum) without waiting; with ``record``,
        log its start now and its end when its future completes."""
        start = self._now()
        work = dist.all_reduce(tensor, async_op=True)
        if self.record:
            work.get_future().then(
                lambda _: self.events.append(
                    TimelineEvent("all-reduce", name, start, self._now())
                )
            )
        return work


class AfterBackwardDDP(MiniDDP):
    """Step 1: after backward, one all-reduce per parameter, largest count of
    messages, no overlap (10)."""

    def synchronize(self) -> None:
        for name, p in self.named_params:
            if p.grad is None:  # unused here but maybe not elsewhere: send zeros
                p.grad = torch.zeros_like(p)
            p.grad.div_(self.world_size)
            self._timed_all_reduce(p.grad, name).wait()


def check_one_dtype(wrapper: str, named_params: list[tuple[str, nn.Parameter]]) -> None:
    """Refuse parameters of several dtypes: a wrapper that packs gradients into one
    buffer would round some of them to another dtype (10)."""
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name, p in named_params:
        by_dtype.setdefault(p.dtype, []).append(name)
    if len(by_dtype) > 1:
        found = "; ".join(
            f"{str(dtype).removeprefix('torch.')}: {', '.join(names)}"
            for dtype, names in by_dtype.items()
        )
        raise TypeError(
            f"{wrapper} packs gradients into buffers of one dtype, but this model's "
            f"parameters have {len(by_dtype)} dtypes ({found}). Convert the model "
            "to one dtype (model.double() or model.float()), or use AfterBackwardDDP."
        )


class FlatDDP(MiniDDP):
    """Step 2: after backward, every gradient in one flat buffer, one all-reduce,
    no overlap (10). Its parameters must share one dtype."""

    def __init__(
        self,
        module: nn.Module,
        find_unused_parameters: bool = False,
        record: bool = False,
    ) -> None:
        super().__init__(module, find_unused_parameters, record)
        check_one_dtype(type(self).__name__, self.named_params)

    def synchronize(self) -> None:
        grads = [
            p.grad if p.grad is not None else torch.zeros_like(p)
            for _, p in self.named_params
        ]
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(self.world_size)
        self._timed_all_reduce(flat, "all gradients").wait()
        offset = 0
        for _, p in self.named_params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
