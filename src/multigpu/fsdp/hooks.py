"""The four hooks of one FSDP unit, written plainly: notebook 14's exercise (14).

:class:`~multigpu.fsdp.FSDPByHand` runs its collectives on a thread and prefetches.
Here everything runs in order, so a unit's life is four short methods of a hooks
object, which :class:`HookedFSDP` calls at the moments FSDP2's hooks run:

- ``pre_forward(unit)``: before the unit's first module computes its forward;
- ``post_forward(unit)``: after its last module has;
- ``pre_backward(unit)``: when the gradient of its outputs has arrived, before
  backward uses its parameters;
- ``post_backward(unit, grad)``: when ``grad``, the gradient of the whole unit on
  this rank's batch, is complete; the hook leaves this rank's chunk of the mean
  gradient over the ranks in ``unit.shard.grad``.

:class:`UnitHooks` is the reference. A :class:`HookedUnit` has the shard (this
rank's chunk of the unit's flat parameters, which Adam updates), the flat buffer
forward and backward read (``buffer``), and ``allocate()`` and ``free()`` for that
buffer's memory (``allocate`` fills it with NaN: memory that comes back holds
nothing). After each hook :class:`HookedFSDP` notes what the unit holds in
:attr:`HookedFSDP.log` and stops at the first state that would break training or
waste memory (:attr:`HookedFSDP.mistake`), which the checker turns into words.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import multigpu.collectives as collectives
from multigpu.collectives import all_gather, reduce_scatter
from multigpu.fsdp.units import FlatUnit, plan_units
from multigpu.zero import shard_of


class UnitHooks:
    """The reference: gather before forward, free after it, gather again before
    backward, then free and reduce-scatter the mean gradient (14)."""

    def pre_forward(self, unit: HookedUnit) -> None:
        unit.allocate()
        all_gather(unit.buffer, unit.shard.detach())

    def post_forward(self, unit: HookedUnit) -> None:
        unit.free()

    def pre_backward(self, unit: HookedUnit) -> None:
        unit.allocate()
        all_gather(unit.buffer, unit.shard.detach())

    def post_backward(self, unit: HookedUnit, grad: torch.Tensor) -> None:
        unit.free()
        chunk = torch.empty_like(unit.shard)
        reduce_scatter(chunk, grad)  # this rank's chunk of the sum over the ranks
        unit.shard.grad = chunk / dist.get_world_size()


class HookedUnit:
    """What a hook gets: ``name``, ``shard``, ``buffer`` (the whole unit, flat;
    no memory while freed), ``allocate()``, ``free()`` and ``allocated`` (14)."""

    def __init__(self, flat: FlatUnit, calls: list[str]) -> None:
        self._flat, self._calls = flat, calls

    name = property(lambda self: self._flat.name)
    shard = property(lambda self: self._flat.shard)
    buffer = property(lambda self: self._flat.writer)  # same memory as forward's
    allocated = property(lambda self: self._flat.full.untyped_storage().nbytes() > 0)

    def allocate(self) -> None:
        """Give the buffer its memory back, filled with NaN."""
        self._calls.append("allocate")
        if not self.allocated:
            self._flat.full.untyped_storage().resize_(self._flat.nbytes())
        self._flat.writer.fill_(math.nan)

    def free(self) -> None:
        """Give the buffer's memory away; the shard stays."""
        self._calls.append("free")
        self._flat.full.untyped_storage().resize_(0)


class MistakeFound(Exception):
    """The first mistake was found: training stops there."""


class HookedFSDP(nn.Module):
    """``module`` sharded unit by unit (the units of
    :func:`~multigpu.fsdp.plan_units`), each unit's life left to ``hooks``, every
    hook's effect checked and logged (14)."""

    def __init__(self, module: nn.Module, hooks: Any, units=None) -> None:
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.module, self.hooks = module, hooks
        self.calls: list[str] = []  # allocate/free calls of the hook running now
        self.flats = [
            FlatUnit(i, names, module, rank, world_size, None)
            for i, names in enumerate(plan_units(module, units))
        ]
        self.units = [HookedUnit(flat, self.calls) for flat in self.flats]
        self.shards = nn.ParameterList(flat.shard for flat in self.flats)
        self.log: list[dict[str, Any]] = []
        self.mistake: dict[str, Any] | None = None
        self.peak_gathered_units = 0
        self.step = 0
        self._expected: list[torch.Tensor] = []
        self._forward_started: set[int] = set()  # units whose forward began
        self._backward_started: set[int] = set()
        for flat, unit in zip(self.flats, self.units):
            for member in flat.modules:
                member.register_forward_pre_hook(self._pre_forward(flat, unit))
                member.register_forward_hook(self._post_forward(flat, unit))
            flat.full.register_post_accumulate_grad_hook(self._post_backward(unit))

    def forward(self, *args, **kwargs):
        self.step += 1
        self._forward_started.clear()
        self._backward_started.clear()
        self._expected = []  # what each unit's buffer must hold when gathered
        for flat in self.flats:
            whole = torch.empty(flat.numel, dtype=flat.shard.dtype)
            all_gather(whole, flat.shard.detach())
            self._expected.append(whole)
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------ the torch hooks
    def _pre_forward(self, flat: FlatUnit, unit: HookedUnit):
        def hook(module, args):
            if flat.index not in self._forward_started:  # its first module
                self._forward_started.add(flat.index)
                self._run("pre_forward", unit, flat)
            flat.install()  # the modules' parameters: views of the buffer

        return hook

    def _post_forward(self, flat: FlatUnit, unit: HookedUnit):
        def hook(module, args, output):
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(self._pre_backward(flat, unit))
            if module is flat.modules[-1]:
                self._run("post_forward", unit, flat)

        return hook

    def _pre_backward(self, flat: FlatUnit, unit: HookedUnit):
        def hook(grad):
            if flat.index not in self._backward_started:
                self._backward_started.add(flat.index)
                self._run("pre_backward", unit, flat)

        return hook

    def _post_backward(self, unit: HookedUnit):
        flat = unit._flat

        def hook(full: torch.Tensor) -> None:
            grad, full.grad = full.grad, None
            total = grad.clone()
            dist.all_reduce(total)  # the checker's own sum, before the learner's
            mean = shard_of(total, dist.get_rank(), dist.get_world_size())
            mean = mean / dist.get_world_size()
            local = shard_of(grad, dist.get_rank(), dist.get_world_size()).clone()
            with _watch_all_reduce(self.hooks) as all_reduces:
                entry = self._run("post_backward", unit, flat, grad)
            entry["all-reduce"] = bool(all_reduces)
            entry["gradient"] = _classify(unit.shard.grad, mean, local)
            if entry["gradient"] != "mean" or entry["all-reduce"] or entry["allocated"]:
                self._stop(entry)

        return hook

    # ------------------------------------------------------------- the checking
    def _run(self, moment: str, unit: HookedUnit, flat: FlatUnit, *args) -> dict:
        """Call the hook of ``moment``, log what the unit holds after it, and stop
        at a mistake (the gradient is checked by the caller)."""
        self.calls.clear()
        before = flat.shard.detach().clone()
        entry: dict[str, Any] = {"step": self.step, "moment": moment, "unit": unit.name}
        try:
            getattr(self.hooks, moment)(unit, *args)
        except Exception as error:  # the learner's: reported, not a traceback
            entry["raised"] = f"{type(error).__name__}: {error}"
            entry["calls"] = list(self.calls)
            entry["allocated"] = unit.allocated
            self.log.append(entry)
            self._stop(entry)
        entry["calls"] = list(self.calls)
        entry["allocated"] = unit.allocated
        entry["holds"] = _holds(flat, self._expected[flat.index], unit.allocated)
        entry["shard changed"] = not torch.equal(flat.shard.detach(), before)
        gathered = sum(u.allocated for u in self.units)
        self.peak_gathered_units = max(self.peak_gathered_units, gathered)
        self.log.append(entry)
        if entry["shard changed"]:
            self._stop(entry)
        if moment in ("pre_forward", "pre_backward"):
            if entry["holds"] != "parameters":
                self._stop(entry)
        elif moment == "post_forward" and entry["allocated"]:
            self._stop(entry)
        return entry

    def _stop(self, entry: dict[str, Any]) -> None:
        self.mistake = entry
        raise MistakeFound(entry["moment"])


def _holds(flat: FlatUnit, expected: torch.Tensor, allocated: bool) -> str | None:
    """What the unit's buffer holds: None (no memory), "parameters", "NaN" or
    "other values"."""
    if not allocated:
        return None
    values = flat.writer.detach()
    if torch.equal(values, expected.to(values.dtype)):
        return "parameters"
    return "NaN" if values.isnan().any().item() else "other values"


def _classify(got, mean: torch.Tensor, local: torch.Tensor) -> str:
    """What the hook left in ``shard.grad``: "mean", "none", "sum", "own batch
    only" or "other values"."""
    if got is None:
        return "none"
    if got.shape != mean.shape:  # torch refuses that; a hook could still get there
        return "other values"
    world_size = dist.get_world_size()
    for name, expected in (("mean", mean), ("sum", mean * world_size)):
        if torch.allclose(got, expected, rtol=1e-5, atol=1e-7):
            return name
    if torch.allclose(got, local, rtol=1e-5, atol=1e-7) or torch.allclose(
        got, local / world_size, rtol=1e-5, atol=1e-7
    ):
        return "own batch only"
    return "other values"


@contextmanager
def _watch_all_reduce(hooks: Any):
    """Within it, every all-reduce (torch's, or one of 07's that the hooks' module
    may have imported) is noted in the list it yields, then run."""
    originals = {dist.all_reduce, *collectives.ALL_REDUCES.values()}
    seen: list[str] = []
    module = sys.modules.get(type(hooks).__module__)
    patched = []
    for owner in (dist, collectives, module):
        for name, value in list(vars(owner).items()) if owner else []:
            if any(value is original for original in originals):

                def watched(*args, _value=value, **kwargs):
                    seen.append(_value.__name__)
                    return _value(*args, **kwargs)

                patched.append((owner, name, value))
                setattr(owner, name, watched)
    try:
        yield seen
    finally:
        for owner, name, value in patched:
            setattr(owner, name, value)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def full_parameters(wrapper: HookedFSDP) -> dict[str, torch.Tensor]:
    """Every trainable weight under its own name, gathered (a collective), and the
    module's other tensors as they are (14)."""
    state = {}
    for flat in wrapper.flats:
        whole = torch.empty(flat.numel, dtype=flat.shard.dtype)
        all_gather(whole, flat.shard.detach())
        for qualified, _, _, offset, shape in flat.slots:
            state[qualified] = whole[offset : offset + shape.numel()].view(shape)
    for name, tensor in wrapper.module.state_dict().items():
        state.setdefault(name, tensor.clone())
    return state
