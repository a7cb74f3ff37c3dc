"""The ladder's third step, PyTorch's design: gradients travel in buckets, each
all-reduced as soon as its last gradient is in, while backward goes on (10).

Parameters are grouped into buckets of about ``bucket_cap_mb`` in reverse
registration order (the order in which backward produces their gradients); a hook
on each parameter (``Tensor.register_post_accumulate_grad_hook``) copies its
gradient into its bucket, and a full bucket is all-reduced at once with
``async_op=True`` while backward continues; at the end of backward every bucket is
waited for and copied back into ``.grad``. PyTorch's file:
https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py
(and the C++ ``Reducer`` in torch/csrc/distributed/c10d/reducer.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.core.checks import check_number
from multigpu.core.sizes import MiB
from multigpu.miniddp.wrappers import MiniDDP, check_one_dtype


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one all-reduce (10)."""

    index: int
    names: list[str]
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (total elements,): every gradient of the bucket, flat
    offsets: list[int]  # where each parameter's gradient starts in ``buffer``
    waiting: set[int] = field(default_factory=set)  # params whose grad is not in yet
    work: Any = None  # the running all-reduce (a torch.distributed Work)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def assign_buckets(
    sizes_in_bytes: list[int], bucket_cap_mb: float, first_bucket_mb: float | None
) -> list[list[int]]:
    """Split tensors, in the order given, into buckets: a bucket is closed once it
    holds at least its limit in bytes; the first bucket's limit is
    ``first_bucket_mb``, the others' ``bucket_cap_mb`` (DDP's rule, as in
    ``torch.distributed._compute_bucket_assignment_by_size``). Returns the indices
    of the tensors in each bucket (10)."""
    limits = [first_bucket_mb if first_bucket_mb is not None else bucket_cap_mb]
    buckets: list[list[int]] = [[]]
    size = 0
    for index, nbytes in enumerate(sizes_in_bytes):
        buckets[-1].append(index)
        size += nbytes
        limit = limits[0] if len(buckets) == 1 else bucket_cap_mb
        if size >= limit * MiB:  # full: the next tensor starts a new bucket
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


class BucketedDDP(MiniDDP):
    """Step 3: buckets, each all-reduced as soon as its last gradient is in, while
    backward goes on (10).

    The first step's buckets follow reverse registration order. Like DDP, the
    buckets are then rebuilt once, after the first backward, in the order in which
    the gradients really arrived (``rebuild_buckets=False`` keeps the first ones).
    With ``find_unused_parameters=True`` they are never rebuilt, as in DDP, whose
    reducer rebuilds only when ``(static_graph_ || !find_unused_parameters_)``
    (``should_rebuild_buckets`` in reducer.hpp): the order gradients arrive in may
    change from step to step. The buckets are then DDP's first ones: filled in
    registration order, sent last bucket first.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_cap_mb: float = 25.0,
        first_bucket_mb: float | None = None,
        find_unused_parameters: bool = False,
        record: bool = False,
        rebuild_buckets: bool = True,
    ) -> None:
        check_number("bucket_cap_mb", bucket_cap_mb, "Pass e.g. bucket_cap_mb=25.")
        if first_bucket_mb is not None:
            check_number(
                "first_bucket_mb", first_bucket_mb, "Pass e.g. first_bucket_mb=1."
            )
        super().__init__(module, find_unused_parameters, record)
        check_one_dtype(type(self).__name__, self.named_params)
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_mb = first_bucket_mb
        # DDP's rule: rebuild once, and never while searching for unused parameters.
        self._rebuild_pending = rebuild_buckets and not find_unused_parameters
        self._arrival: list[nn.Parameter] = []  # this backward's order of gradients
        params = [p for _, p in self.named_params]
        if find_unused_parameters:  # DDP's buckets for good: filled first to last
            self._build_buckets(params, in_registration_order=True)
        else:  # backward produces gradients from the last layer to the first
            self._build_buckets(params[::-1])

    def _build_buckets(
        self, order: list[nn.Parameter], in_registration_order: bool = False
    ) -> None:
        names = {id(p): name for name, p in self.named_params}
        sizes = [p.numel() * p.element_size() for p in order]
        first_mb = self.first_bucket_mb
        if in_registration_order and (first_mb or 0) >= self.bucket_cap_mb:
            first_mb = None  # DDP's first buckets take a first limit only if smaller
        groups = assign_buckets(sizes, self.bucket_cap_mb, first_mb)
        if in_registration_order:
            groups = groups[::-1]  # filled first to last, sent last first
        self.buckets: list[Bucket] = []
        for index, members in enumerate(groups):
            params = [order[i] for i in members]
            offsets, total = [], 0
            for p in params:
                offsets.append(total)
                total += p.numel()
            buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
            bucket_names = [names[id(p)] for p in params]
            self.buckets.append(Bucket(index, bucket_names, params, buffer, offsets))
        self._bucket_of = {
            id(p): (bucket, i)
            for bucket in self.buckets
            for i, p in enumerate(bucket.params)
        }

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        for bucket in self.buckets:
            bucket.waiting = {id(p) for p in bucket.params}
            bucket.work = None
        self._arrival = []
        return super().forward(*inputs, **kwargs)

    def gradient_ready(self, param: nn.Parameter) -> None:
        self._arrival.append(param)
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        if param.grad is None:  # unused here: contribute zeros
            view.zero_()
        else:
            view.copy_(param.grad.reshape(-1)).div_(self.world_size)
        bucket.waiting.discard(id(param))
        if not bucket.waiting:  # the bucket is full: send it now, do not wait
            bucket.work = self._timed_all_reduce(
                bucket.buffer, f"bucket {bucket.index}"
            )

    def synchronize(self) -> None:
        for bucket in self.buckets:
            bucket.work.wait()
            for p, offset in zip(bucket.params, bucket.offsets):
                mean = bucket.buffer[offset : offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
        if self._rebuild_pending:  # once, after the first backward that synced
            self._build_buckets(self._arrival)
            self._rebuild_pending = False


def bucket_layout(model: nn.Module) -> list[list[str]]:
    """The parameter names in each bucket of a :class:`BucketedDDP`, in the order
    the buckets are sent: the buckets its next step will use (10). PyTorch's DDP
    shows its buckets only to a hook: see :func:`record_torch_buckets`."""
    if not isinstance(model, BucketedDDP):
        raise TypeError(
            f"bucket_layout reads a BucketedDDP's buckets, got {type(model).__name__}."
            " For PyTorch's DDP call record_torch_buckets(model) before training."
        )
    return [list(bucket.names) for bucket in model.buckets]


def record_torch_buckets(model: DDP) -> list[list[list[str]]]:
    """PyTorch's DDP's bucket layout, which it shows only to a communication hook:
    the counterpart of :func:`bucket_layout` (10).

    Registers a hook on ``model`` (a ``DistributedDataParallel``) that logs the
    parameter names of every bucket, then all-reduces it as DDP's default does, so
    training is unchanged. Returns the log, filled as steps run: one list per step
    that synchronized (a ``no_sync`` backward logs nothing) of the buckets in the
    order they were sent, each with its parameters in DDP's order. Call it before
    the first step; DDP takes one hook only, so not with another hook.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    if not isinstance(model, DDP):
        raise TypeError(
            "record_torch_buckets needs PyTorch's DistributedDataParallel, got "
            f"{type(model).__name__}. For a BucketedDDP read bucket_layout(model)."
        )
    names = {id(p): name for name, p in model.module.named_parameters()}
    log: list[list[list[str]]] = []

    def hook(state, bucket):  # no annotations: DDP checks them, and they are text here
        if bucket.index() == 0:  # bucket 0 is the first to be sent in a step
            log.append([])
        log[-1].append([names[id(p)] for p in bucket.parameters()])
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    return log
