"""FSDP by hand: per-unit all-gather, free, re-gather, reduce-scatter (14).

:class:`FSDPByHand` wraps a model built on every rank. Each unit of
:func:`~multigpu.fsdp.units.plan_units` keeps only its shard. Module hooks do what
FSDP2's do (``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``):

- before a unit's forward, its all-gather (the prefetch function issues it, and the
  next ``depth`` units' in the last step's order, :mod:`~multigpu.fsdp.prefetch`);
  its modules' parameters become views of the gathered buffer;
- after its forward, the buffer's memory is freed (``storage.resize_(0)``, as FSDP2's
  ``free_storage`` in ``_fsdp_param.py``); the tensors autograd saved are views of
  it, so backward's re-gather into the same memory restores them;
- before its backward (a hook on its outputs' gradients), the re-gather;
- when its gradient is complete (``register_post_accumulate_grad_hook`` on the
  buffer), free it and queue the reduce-scatter of the gradient;
- at the end of backward (``queue_callback``, as FSDP2's root does), wait for every
  reduce-scatter and put the mean gradient into the ``.grad`` of each parameter's
  piece of the shard (``shards``, what the optimizer updates); a parameter that
  backward did not reach (no forward read it) keeps ``grad`` None, as in one
  process and in FSDP2 (which reduces only the gradients that exist).

Collectives run on a :class:`~multigpu.fsdp.stream.CommStream`; a
:class:`~multigpu.zero.Meter` counts bytes sent and gathered bytes alive; with
``record=True`` the timeline also holds a "gathered" span per unit from the moment
its memory comes back to the moment it is freed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from multigpu.fsdp.mixed_precision import gather_parameters, reduce_gradient
from multigpu.fsdp.prefetch import issue_with_prefetch
from multigpu.fsdp.stream import CommStream, Handle
from multigpu.fsdp.units import FlatUnit, plan_units
from multigpu.miniddp.timeline import TimelineEvent
from multigpu.zero import Meter, agree_on

PrefetchFunction = Callable[..., None]  # (wrapper, order, position) -> None
GatherFunction = Callable[[torch.Tensor, torch.Tensor], int]  # (shard, full)
ReduceFunction = Callable[[torch.Tensor, torch.Tensor], int]  # (grad, shard grad)


class FSDPByHand(nn.Module):
    """``module`` sharded unit by unit over the ranks of the default group (14).

    ``depth``: how many units ahead to all-gather; ``param_dtype``: the compute
    dtype (None: the model's); ``reshard_after_forward=False`` keeps every unit
    gathered from its forward to its backward (one all-gather per step, not two);
    ``record``: keep a timeline. ``prefetch``, ``gather`` and ``reduce`` replace
    the three functions the notebook's exercises ask for. ``shards``: this
    rank's piece of each trainable parameter, for the optimizer. Every rank must
    pass the same model (e.g. after ``broadcast_from_rank0``) and the same
    arguments, and run the same units in forward: before each all-gather and
    reduce-scatter the ranks compare which unit they move (:meth:`agree`), and a
    unit that only some ranks run is refused by name on every rank; and read the
    same parameters, as FSDP2 asks: a parameter no forward read on this rank gets no
    gradient on this rank.
    """

    def __init__(
        self,
        module: nn.Module,
        units: Sequence[Sequence[str] | str] | None = None,
        depth: int = 0,
        param_dtype: torch.dtype | None = None,
        reshard_after_forward: bool = True,
        record: bool = False,
        prefetch: PrefetchFunction = issue_with_prefetch,
        gather: GatherFunction = gather_parameters,
        reduce: ReduceFunction = reduce_gradient,
    ) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(
                f"depth must be an integer of at least 0, got {depth!r}. Pass how "
                "many units ahead to all-gather, e.g. depth=0 (none) or depth=1."
            )
        plan = plan_units(module, units)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.module = module
        self.depth, self.reshard_after_forward = depth, reshard_after_forward
        self.prefetch, self.gather, self.reduce = prefetch, gather, reduce
        self.units = [
            FlatUnit(i, names, module, rank, world_size, param_dtype)
            for i, names in enumerate(plan)
        ]
        self.shards = nn.ParameterList(
            piece for unit in self.units for _, _, piece in unit.pieces.values()
        )
        self.param_dtype = param_dtype
        self.frozen_masters: dict[str, torch.Tensor] = {}
        for name, p in list(module.named_parameters()):
            if param_dtype is not None and p.dtype != param_dtype:  # frozen ones
                self.frozen_masters[name] = p.detach()
                owner, _, attr = name.rpartition(".")
                setattr(
                    module.get_submodule(owner),
                    attr,
                    nn.Parameter(p.detach().to(param_dtype), requires_grad=False),
                )
        self.meter = Meter()
        self.stream = CommStream(record)
        self.events: list[TimelineEvent] = []  # the compute spans
        self.forward_order: list[int] = []  # units in the order forward ran them
        self._ran: dict[str, list[int]] = {"forward": [], "backward": []}  # this step
        self._in_backward = False
        self._reduced: list[tuple[FlatUnit, set[int], Handle]] = []
        self._started: dict[int, float] = {}
        for unit in self.units:
            for member in unit.modules:
                member.register_forward_pre_hook(self.pre_forward(unit))
                member.register_forward_hook(self.post_forward(unit))
            unit.full.register_post_accumulate_grad_hook(self.post_backward(unit))

    # ---------------------------------------------------------------- collectives
    def issue_gather(self, index: int) -> Handle:
        """Queue unit ``index``'s all-gather (once) and return its handle."""
        unit = self.units[index]
        if unit.handle is None:
            unit.full.untyped_storage().resize_(unit.nbytes())  # the memory comes back
            self.meter.gathered(unit.writer)
            unit.gathered_at = self.stream.now()

            def work() -> None:
                self.agree(unit, "all-gather")
                self.meter.bytes_sent += self.gather(unit.shard, unit.writer)

            unit.handle = self.stream.submit("all-gather", unit.name, work)
        return unit.handle

    def agree(self, unit: FlatUnit, collective: str) -> None:
        """On the stream, before ``unit``'s ``collective``: raise the same
        ValueError on every rank if the ranks are about to move different units (a
        unit some ranks' batches skip), instead of pairing two units' collectives."""
        names = [u.name for u in self.units]
        agree_on(
            unit.index, collective, names, _COLLECTIVES, "FSDP by hand", "unit", "DDP"
        )

    def free(self, unit: FlatUnit) -> None:
        """Give the gathered buffer's memory back; the shard stays."""
        if unit.handle is not None:
            unit.handle.wait()
            unit.full.untyped_storage().resize_(0)
            self.meter.freed(unit.writer)
            unit.handle = None
            if self.stream.record:  # how long the unit's memory was there
                now = self.stream.now()
                self.events.append(
                    TimelineEvent("gathered", unit.name, unit.gathered_at, now)
                )

    def _ready(self, unit: FlatUnit, when: str) -> None:
        """Call the prefetch function with this step's order: the units this step's
        forward (or backward) has run, ``unit`` last, then the others as the last
        forward ran them (reversed in backward). A unit the previous steps did not
        run has its place too: the order is recorded anew in every step, as FSDP2
        records its post-forward order and clears it when backward ends."""
        ran = self._ran[when]
        if unit.index not in ran:
            ran.append(unit.index)
        known = self.forward_order if when == "forward" else self.forward_order[::-1]
        order = ran + [index for index in known if index not in ran]
        self.prefetch(self, order, order.index(unit.index))
        if unit.handle is None or unit.handle.future is not None:
            raise RuntimeError(
                f"Unit {unit.name} is about to compute its {when}, but its "
                "all-gather was not waited for, so its parameters may not have "
                "arrived. The prefetch function must call .wait() on the handle of "
                "the unit that computes now (order[position])."
            )
        self._started[unit.index] = self.stream.now()

    def _span(self, unit: FlatUnit, what: str) -> None:
        start = self._started.pop(unit.index, None)
        if self.stream.record and start is not None:
            name = f"{what} {unit.name}"
            self.events.append(TimelineEvent("compute", name, start, self.stream.now()))

    # ---------------------------------------------------------------------- hooks
    def pre_forward(self, unit: FlatUnit):
        """The hook before each module of ``unit`` runs forward."""

        def hook(module, args):
            if self._in_backward:  # activation checkpointing recomputes forward
                self.issue_gather(unit.index).wait()
                unit.install(watch=True)
                return
            if unit.index not in self._started:
                self._ready(unit, "forward")
            unit.install(watch=True)  # notes which parameters backward reaches

        return hook

    def post_forward(self, unit: FlatUnit):
        """The hook after each module of ``unit`` ran forward."""

        def hook(module, args, output):
            if self._in_backward:  # a recomputation: backward still needs the unit
                return
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(self.pre_backward(unit))
            if module is unit.modules[-1]:
                self._span(unit, "forward")
                if self.reshard_after_forward:
                    self.free(unit)

        return hook

    def pre_backward(self, unit: FlatUnit):
        """The hook on the gradient of ``unit``'s outputs: its backward begins."""

        def hook(grad):
            if unit.index not in self._started:
                self._ready(unit, "backward")

        return hook

    def post_backward(self, unit: FlatUnit):
        """The hook after ``unit``'s gradient is complete: free, reduce-scatter."""

        def hook(full: torch.Tensor) -> None:
            self._span(unit, "backward")
            grad, full.grad = full.grad, None  # (numel,) in the compute dtype
            read, unit.read = unit.read, set()  # the parameters backward reached
            self.free(unit)

            def work() -> torch.Tensor:
                self.agree(unit, "reduce-scatter")
                shard_grad = torch.empty_like(unit.shard)  # master dtype
                self.meter.bytes_sent += self.reduce(grad, shard_grad)
                return shard_grad

            handle = self.stream.submit("reduce-scatter", unit.name, work)
            self._reduced.append((unit, read, handle))

        return hook

    def _start_backward(self, grad):
        self._in_backward = True
        Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        """End of backward: every reduce-scatter done, gradients into the shards."""
        self.stream.synchronize()
        for unit, read, handle in self._reduced:
            chunk = handle.wait()  # the mean gradient of this rank's shard
            for offset, (_, where, piece) in unit.pieces.items():
                if offset not in read:
                    continue  # no forward read it: its gradient stays None
                if piece.grad is None:
                    piece.grad = chunk[where]
                else:  # accumulation over several backwards
                    piece.grad += chunk[where]
        self._reduced = []
        for unit in self.units:
            self.free(unit)  # e.g. a unit whose gradient never came
            unit.read.clear()
        self._started.clear()
        self._ran = {"forward": [], "backward": []}  # as FSDP2 clears its order
        self._in_backward = False

    # -------------------------------------------------------------------- forward
    def forward(self, *args, **kwargs):
        self._started.clear()
        if self.param_dtype is not None:
            args, kwargs = _cast((args, kwargs), self.param_dtype)
        output = self.module(*args, **kwargs)
        self.forward_order = list(self._ran["forward"])
        for tensor in _tensors(output)[:1]:
            if tensor.requires_grad:
                tensor.register_hook(self._start_backward)
        if not torch.is_grad_enabled():
            for unit in self.units:
                self.free(unit)
        return output

    def reset_timeline(self) -> None:
        """Start a new timeline: time 0 is now."""
        self.stream.synchronize()
        self.events.clear()
        self.stream.events.clear()
        self.stream.t0 = time.perf_counter()

    def timeline(self) -> list[TimelineEvent]:
        """Compute spans and collectives since the start, sorted by start time."""
        self.stream.synchronize()
        return sorted(self.events + self.stream.events, key=lambda e: e.start)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights under its own names (tied names included), in
        the master dtype, gathered on every rank (a collective); buffers and frozen
        parameters as they are."""
        self.stream.synchronize()
        state = {}
        for unit in self.units:
            full = torch.empty(unit.numel, dtype=unit.shard.dtype)
            self.meter.bytes_sent += gather_parameters(unit.shard, full)
            for qualified, _, _, offset, shape in unit.slots:
                state[qualified] = full[offset : offset + shape.numel()].view(shape)
        for name, tensor in self.module.state_dict().items():
            state.setdefault(name, self.frozen_masters.get(name, tensor).clone())
        return state

    def unit_numels(self) -> list[int]:
        return [unit.numel for unit in self.units]

    def holds_parameters(self, tensor: torch.Tensor) -> bool:
        """Does ``tensor`` share memory with a gathered unit or a frozen parameter
        (for :class:`~multigpu.fsdp.checkpointing.SavedActivations`)?"""
        address = tensor.untyped_storage().data_ptr()
        gathered = [u.full for u in self.units if u.handle is not None]
        frozen = list(self.module.parameters())
        return any(address == t.untyped_storage().data_ptr() for t in gathered + frozen)


_COLLECTIVES = ("all-gather", "reduce-scatter")


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value
