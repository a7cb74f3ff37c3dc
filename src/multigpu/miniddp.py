"""A DistributedDataParallel built by hand, in three steps of a ladder (10).

Taught in ``notebooks/10_ddp_by_hand.ipynb``. Notebook 08 averaged the gradients
after ``backward()`` had finished, so every rank sat idle while they travelled.
PyTorch's DDP hides most of that time: it starts all-reducing a *bucket* of
gradients as soon as the last gradient of the bucket has been computed, while
backward goes on with the layers below. Three wrappers climb to that design:

- :class:`AfterBackwardDDP`: once backward has finished, one all-reduce per
  parameter (08's idea, a message per tensor);
- :class:`FlatDDP`: once backward has finished, one all-reduce of every gradient
  packed into one flat buffer (08's ``average_gradients``);
- :class:`BucketedDDP`: PyTorch's design. Parameters are grouped into buckets of
  about ``bucket_cap_mb`` in reverse registration order (the order in which
  backward produces their gradients); a hook on each parameter
  (``Tensor.register_post_accumulate_grad_hook``) copies its gradient into its
  bucket, and a full bucket is all-reduced at once with ``async_op=True`` while
  backward continues; at the end of backward every bucket is waited for and copied
  back into ``.grad``.

What the three share (:class:`MiniDDP`), as DDP does it: rank 0's parameters and
buffers are broadcast when the wrapper is built, buffers again before every
forward; gradients are divided by the world size and summed, so they become the
mean over the ranks; ``no_sync()`` skips the communication (decided in
``forward``, like DDP); a parameter that received no gradient is an error
(:class:`UnusedParameterError`), unless ``find_unused_parameters=True``, which pays
for a walk over the autograd graph after every forward and one more all-reduce.

The end of backward is found the way DDP finds it: the first gradient hook of a
backward pass queues a callback that the autograd engine runs once the whole pass
is done (``Variable._execution_engine.queue_callback``, what
``torch/nn/parallel/distributed.py`` uses). So, like DDP, the wrappers need no
extra call: ``loss.backward()`` returns with averaged gradients.

With ``record=True`` a wrapper keeps a timeline of the last step (:class:`Event`):
when each layer's gradients were computed and when each all-reduce started and
ended (the end seen by a callback on the all-reduce's future).

PyTorch's file: https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py
(and the C++ ``Reducer`` in torch/csrc/distributed/c10d/reducer.cpp).
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel as DDP

from multigpu.allreduce_sgd import epoch_means, max_parameter_difference, run_batches
from multigpu.core.checks import check_choice, check_number
from multigpu.core.train import History, TrainConfig, cpu_state_dict

# The three steps of the ladder, and PyTorch's DDP for comparison.
STRATEGIES = ("after_backward", "flat", "bucketed", "torch")
MB = 1024 * 1024  # DDP's "MB" is a mebibyte


class UnusedParameterError(RuntimeError):
    """A parameter got no gradient in a backward pass that all-reduces (10)."""


@dataclass
class Event:
    """One span on the timeline of a step: ``lane`` is "backward" or "all-reduce",
    times in seconds since the forward pass began (10)."""

    lane: str
    name: str
    start: float
    end: float


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
        if size >= limit * MB:  # full: the next tensor starts a new bucket
            buckets.append([])
            size = 0
    return [bucket for bucket in buckets if bucket]


def broadcast_from_rank0(tensors: Iterator[torch.Tensor]) -> None:
    """Overwrite every tensor with rank 0's values, in place (10)."""
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)


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
        self.events: list[Event] = []
        self._sync_this_backward = False  # decided in forward, as DDP does
        self._callback_queued = False
        self._ready: set[int] = set()  # ids of params whose gradient is in
        self._unused: set[int] = set()  # ids found unused after this forward
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
            self.events.append(Event("backward", "forward", 0.0, now))
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
                Event("backward", self._layer_of(param), self._last_ready, now)
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
            self.events.append(Event("backward", "sync", start, self._now()))

    def _keep_unused_grads_as_ddp_does(self) -> None:
        """A parameter that no rank used keeps ``grad=None`` (DDP's rule); one that
        some rank used gets the mean gradient. One more all-reduce, of a 0/1 map."""
        used = torch.tensor(
            [0.0 if id(p) in self._unused else 1.0 for _, p in self.named_params]
        )
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
                    Event("all-reduce", name, start, self._now())
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


class FlatDDP(MiniDDP):
    """Step 2: after backward, every gradient in one flat buffer, one all-reduce,
    no overlap (10)."""

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


class BucketedDDP(MiniDDP):
    """Step 3: buckets, each all-reduced as soon as its last gradient is in, while
    backward goes on (10).

    The first step's buckets follow reverse registration order. Like DDP, the
    buckets are then rebuilt once, after the first backward, in the order in which
    the gradients really arrived (``rebuild_buckets=False`` keeps the first ones).
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
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_mb = first_bucket_mb
        self._rebuild_pending = rebuild_buckets
        self._arrival: list[nn.Parameter] = []  # this backward's order of gradients
        # Backward produces gradients from the last layer to the first, so the
        # first buckets are filled in reverse registration order.
        self._build_buckets([p for _, p in reversed(self.named_params)])

    def _build_buckets(self, order: list[nn.Parameter]) -> None:
        names = {id(p): name for name, p in self.named_params}
        sizes = [p.numel() * p.element_size() for p in order]
        self.buckets: list[Bucket] = []
        for index, members in enumerate(
            assign_buckets(sizes, self.bucket_cap_mb, self.first_bucket_mb)
        ):
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


def wrap(
    model: nn.Module, strategy: str | type = "bucketed", **options: Any
) -> nn.Module:
    """``model`` wrapped by one step of the ladder, or by PyTorch's DDP
    (``strategy="torch"``), or by a wrapper class of your own; ``options`` go to
    the wrapper (10)."""
    if isinstance(strategy, type):
        return strategy(model, **options)
    check_choice("strategy", strategy, STRATEGIES)
    if strategy == "torch":
        return DDP(model, **options)
    if strategy == "bucketed":
        return BucketedDDP(model, **options)
    if "bucket_cap_mb" in options or "first_bucket_mb" in options:
        raise ValueError(
            f"The {strategy!r} strategy has no buckets, so bucket sizes mean nothing "
            "to it. Leave out bucket_cap_mb, or use strategy='bucketed'."
        )
    return {"after_backward": AfterBackwardDDP, "flat": FlatDDP}[strategy](
        model, **options
    )


def bucket_layout(model: nn.Module) -> list[list[str]]:
    """The parameter names in each bucket of a :class:`BucketedDDP` (10)."""
    return [list(bucket.names) for bucket in model.buckets]


def record_torch_buckets(model: DDP) -> list[list[list[str]]]:
    """Make ``model`` (PyTorch's DDP) log the parameter names of every bucket it
    all-reduces, through a communication hook that then all-reduces as DDP's default
    does. Returns the log: one list of buckets per step, filled as steps run (10)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
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


def train(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    strategy: str | type = "bucketed",
    options: dict | None = None,
    accumulation: int = 1,
    fp16_compress: bool = False,
) -> History:
    """Notebook 08's training run with ``model`` wrapped by ``strategy``: the same
    batches, so the same weights as one process on the global batch. With
    ``accumulation=k`` each rank's batch is split into k micro-batches, the first
    k - 1 inside ``no_sync()``. ``fp16_compress=True`` (PyTorch's DDP only) sends
    the gradients as float16 through DDP's ``fp16_compress_hook`` (10)."""
    wrapped = wrap(copy.deepcopy(model), strategy, **(options or {}))
    if fp16_compress:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            fp16_compress_hook,
        )

        if strategy != "torch":
            raise ValueError(
                "fp16_compress=True registers a communication hook of PyTorch's DDP; "
                f"the {strategy!r} strategy has none. Use strategy='torch'."
            )
        wrapped.register_comm_hook(None, fp16_compress_hook)
    optimizer = torch.optim.SGD(
        wrapped.parameters(), lr=config.lr, momentum=config.momentum
    )
    history = History(rank=rank, world_size=world_size)
    batches, steps_per_epoch = run_batches(len(X), config, world_size, rank)
    for indices in batches:
        optimizer.zero_grad()
        chunks = indices.chunk(accumulation)
        loss_sum = 0.0
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            context = contextlib.nullcontext() if last else wrapped.no_sync()
            with context:
                loss = nn.functional.cross_entropy(wrapped(X[chunk]), y[chunk])
                (loss / len(chunks)).backward()
            loss_sum += loss.item() / len(chunks)
        optimizer.step()
        history.step_loss.append(loss_sum)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(wrapped.module)
    return history


def compare_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    strategies: tuple[str, ...] = STRATEGIES,
    options: dict | None = None,
    accumulation: int = 1,
) -> dict[str, History]:
    """:func:`train` once per strategy, in one launch (10)."""
    return {
        strategy: train(
            rank,
            world_size,
            model,
            X,
            y,
            config,
            strategy,
            options if strategy in ("bucketed", "torch") else None,
            accumulation,
        )
        for strategy in strategies
    }


class BranchNet(nn.Module):
    """A trunk and two heads; ``forward(x, use_b)`` adds head ``b`` only when asked,
    so its parameters get no gradient otherwise: the unused-parameter case (10)."""

    def __init__(self, features: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.trunk = nn.Linear(features, features)
        self.head_a = nn.Linear(features, classes)
        self.head_b = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, use_b: bool = False) -> torch.Tensor:
        h = torch.relu(self.trunk(x))  # x: (batch, features)
        out = self.head_a(h)
        return out + self.head_b(h) if use_b else out  # (batch, classes)


def unused_worker(
    rank: int,
    world_size: int,
    strategy: str,
    find_unused_parameters: bool,
    b_on_ranks: tuple[int, ...] = (),
    steps: int = 3,
) -> dict[str, Any]:
    """A few SGD steps of :class:`BranchNet` (float64) where head ``b`` is used
    only on the ranks in ``b_on_ranks``. Returns the final parameters, or the error
    that stopped training and the step it came at (10)."""
    torch.manual_seed(0)
    model = wrap(
        BranchNet().double(), strategy, find_unused_parameters=find_unused_parameters
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(rank + 1)  # every rank its own data
    X, y = torch.randn(8, 8, dtype=torch.float64), torch.randint(0, 3, (8,))
    try:
        for step in range(steps):  # noqa: B007 (the except reports it)
            optimizer.zero_grad()
            out = model(X, use_b=rank in b_on_ranks)
            nn.functional.cross_entropy(out, y).backward()
            optimizer.step()
    except RuntimeError as error:
        return {"step": step, "error": type(error).__name__, "message": str(error)}
    return {"parameters": cpu_state_dict(model.module)}


def layouts_worker(
    rank: int, world_size: int, model: nn.Module, bucket_cap_mb: float, steps: int = 3
) -> dict[str, Any]:
    """The bucket layouts of :class:`BucketedDDP` and of PyTorch's DDP (as its hook
    saw them) at each of ``steps`` steps on random data, with the same
    ``bucket_cap_mb`` (10)."""
    torch.manual_seed(rank)
    ours = BucketedDDP(copy.deepcopy(model), bucket_cap_mb=bucket_cap_mb)
    theirs = DDP(copy.deepcopy(model), bucket_cap_mb=bucket_cap_mb)
    log = record_torch_buckets(theirs)
    X = torch.randn(4, 1, 8, 8, dtype=next(model.parameters()).dtype)
    layouts = []
    for _ in range(steps):
        layouts.append(bucket_layout(ours))  # the buckets this step will use
        for wrapped in (ours, theirs):
            wrapped(X).sum().backward()
    return {"ours": layouts, "torch": log}


def timeline_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    strategies: tuple[str, ...] = ("flat", "bucketed"),
    options: dict | None = None,
    steps: int = 3,
) -> dict[str, list[Event]]:
    """The timeline of the last of ``steps`` training steps for each strategy on
    this rank's batch X, y (10)."""
    timelines = {}
    for strategy in strategies:
        wrapped = wrap(
            copy.deepcopy(model),
            strategy,
            record=True,
            **(options or {} if strategy == "bucketed" else {}),
        )
        for _ in range(steps):
            dist.barrier()
            wrapped.zero_grad()
            nn.functional.cross_entropy(wrapped(X), y).backward()
        timelines[strategy] = sorted(wrapped.events, key=lambda e: e.start)
    return timelines


def hidden_fraction(events: list[Event]) -> float:
    """Of the time all-reduces ran, the fraction that backward was still computing
    (before its last gradient): how much communication it hid (10)."""
    backward_end = max(
        (e.end for e in events if e.lane == "backward" and e.name != "sync"),
        default=0.0,
    )
    comm = [e for e in events if e.lane == "all-reduce"]
    total = sum(e.end - e.start for e in comm)
    hidden = sum(max(0.0, min(e.end, backward_end) - e.start) for e in comm)
    return hidden / total if total > 0 else 0.0


def step_time_worker(
    rank: int,
    world_size: int,
    model: nn.Module,
    per_rank_batch: int,
    input_shape: tuple[int, ...],
    variants: list[tuple[str, str, dict]],
    steps: int = 10,
) -> dict[str, dict[str, float]]:
    """Median seconds of a training step (forward, backward, all gradient
    communication, SGD step) for each ``(label, strategy, options)``, the slowest
    rank counting, variants taking turns so that a busy moment hits all of them;
    also the median fraction of communication hidden behind backward (bench) (10)."""
    torch.manual_seed(0)
    X = torch.randn(per_rank_batch, *input_shape)
    y = torch.randint(0, 10, (per_rank_batch,))
    models = {}
    for label, strategy, options in variants:
        record = strategy != "torch"
        extra = {"record": True} if record else {}
        models[label] = wrap(copy.deepcopy(model), strategy, **options, **extra)
    optimizers = {
        label: torch.optim.SGD(m.parameters(), lr=0.01) for label, m in models.items()
    }
    seconds: dict[str, list[float]] = {label: [] for label in models}
    hidden: dict[str, list[float]] = {label: [] for label in models}
    for step in range(steps + 2):
        for label, wrapped in models.items():
            dist.barrier()
            start = time.perf_counter()
            optimizers[label].zero_grad()
            nn.functional.cross_entropy(wrapped(X), y).backward()
            optimizers[label].step()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if step >= 2:  # two warm-up steps (torch DDP rebuilds its buckets)
                seconds[label].append(elapsed.item())
                if isinstance(wrapped, MiniDDP):
                    hidden[label].append(hidden_fraction(wrapped.events))
    return {
        label: {
            "seconds": statistics.median(seconds[label]),
            "hidden": statistics.median(hidden[label])
            if hidden[label]
            else float("nan"),
        }
        for label in models
    }


def _probe_worker(
    rank: int,
    world_size: int,
    wrapper: type,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
) -> dict[str, Any]:
    """One backward through ``wrapper`` watching when its buckets' all-reduces were
    started, then a training run with it (check_wrapper)."""

    class Probe(wrapper):
        def gradient_ready(self, param: nn.Parameter) -> None:
            super().gradient_ready(param)
            self.started.append(sum(b.work is not None for b in self.buckets))

    probe = Probe(copy.deepcopy(model), bucket_cap_mb=0.002)
    probe.started = []
    nn.functional.cross_entropy(probe(X[:4]), y[:4]).backward()
    history = train(rank, world_size, model, X, y, config, wrapper)
    return {"started": probe.started, "buckets": len(probe.buckets), "run": history}


def check_wrapper(
    wrapper: type,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    world_size: int = 2,
) -> tuple[bool, str]:
    """Does ``wrapper``, a subclass of :class:`BucketedDDP` with its own
    ``gradient_ready`` and ``synchronize``, train like one process on the global
    batch, and start each bucket's all-reduce during backward? (passed, what to
    fix) (10). ``wrapper`` must live in a module the ranks can import (a
    ``%%module`` cell)."""
    from multigpu.allreduce_sgd import train_single_process
    from multigpu.runtime.launch import spawn

    if not (isinstance(wrapper, type) and issubclass(wrapper, BucketedDDP)):
        raise TypeError(
            f"check_wrapper needs a subclass of BucketedDDP, got {wrapper!r}. Write "
            "`class MyDDP(BucketedDDP):` in a %%module cell and import it."
        )
    if wrapper.__module__ in ("__main__", "__mp_main__"):
        raise TypeError(
            f"{wrapper.__name__} is defined in the notebook, so the ranks cannot "
            "import it. Write it in a %%module cell and import it from there."
        )
    reference = train_single_process(model, X, y, config)
    results = spawn(
        _probe_worker, world_size, wrapper, model, X, y, config, timeout=60.0
    )
    first = results[0]
    if any(
        max_parameter_difference(r["run"].parameters, first["run"].parameters) > 0
        for r in results[1:]
    ):
        return False, (
            f"FAIL: the {world_size} ranks ended with different weights: their "
            "gradients were not averaged. In gradient_ready, copy each gradient into "
            "its bucket; once the bucket is full, all-reduce it; in synchronize, "
            "copy the buckets back into .grad."
        )
    distance = max_parameter_difference(first["run"].parameters, reference.parameters)
    if distance > 1e-9:
        return False, (
            f"FAIL: the ranks agree, but end {distance:.1e} away from one process on "
            "the global batch: divide by the world size exactly once (the "
            "all-reduce sums)."
        )
    started = first["started"]
    if first["buckets"] > 1 and (len(started) < 2 or started[-2] == 0):
        return False, (
            "FAIL: the weights are right, but no all-reduce had started before "
            "backward computed its last gradient, so nothing overlapped. Start a "
            "bucket's all-reduce in gradient_ready as soon as its last gradient is "
            "in, with async_op=True, and keep the Work in bucket.work."
        )
    return True, (
        f"PASS: {wrapper.__name__} trains like one process on the global batch on "
        f"{world_size} ranks, and sent {started[-2]} of {first['buckets']} buckets "
        "before backward ended."
    )
