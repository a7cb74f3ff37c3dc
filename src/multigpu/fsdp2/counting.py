"""Counting what FSDP2 does: its collectives, and the parameter bytes a rank holds
(14b).

:class:`CollectiveLog` wraps the three ``torch.distributed`` functions that FSDP2
calls (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``:
``dist.all_gather_single`` and ``dist.reduce_scatter_single``; ``dist.all_reduce``
for HSDP's replicas) and records each call: its kind, bytes, dtype, group size and
the unit that issued it (FSDP2's ``FSDPParamGroup.unshard`` is wrapped to know
which), and when each unit's backward starts (``FSDPState._pre_backward``,
``_fsdp_state.py``). :func:`parameter_bytes_held` reads a rank's FSDP2 parameter storage
(``_fsdp_param.py``: the shard, the all-gather outputs, the post-forward shard).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_WRAPPED = {
    "all-gather": "all_gather_single",
    "reduce-scatter": "reduce_scatter_single",
    "all-reduce": "all_reduce",
}


@dataclass
class CollectiveLog:
    """Inside ``with CollectiveLog(model) as log:`` every FSDP2 collective of this
    rank is appended to ``log.calls`` as a dict (kind, bytes, dtype, group size,
    unit); ``log.events`` lists "all-gather <unit>" as each is issued, "compute
    <unit>" when a unit's backward starts (after FSDP2's pre-backward hook, which
    all-gathers and prefetches), and the caller's own events (``log.mark``, e.g.
    "compute 0" from a forward pre-hook) (14b)."""

    model: nn.Module | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    _saved: dict[str, Any] = field(default_factory=dict)
    _unit: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """How many collectives of ``kind`` ("all-gather", "reduce-scatter",
        "all-reduce") ran."""
        return sum(call["kind"] == kind for call in self.calls)

    def mark(self, event: str) -> None:
        """Add the caller's event to :attr:`events`."""
        self.events.append(event)

    def clear(self) -> None:
        """Forget what was recorded so far."""
        self.calls.clear()
        self.events.clear()

    def _record(self, kind: str, tensor: torch.Tensor, group: Any) -> None:
        unit = self._unit[-1] if self._unit else "?"
        self.calls.append(
            {
                "kind": kind,
                "bytes": tensor.numel() * tensor.element_size(),
                "dtype": str(tensor.dtype).replace("torch.", ""),
                "group size": dist.get_world_size(group),
                "unit": unit,
            }
        )
        if kind == "all-gather":
            self.events.append(f"all-gather {unit}")

    def __enter__(self) -> CollectiveLog:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import (
            FSDPParamGroup,
        )
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        names, state_names = {}, {}
        if self.model is not None:
            for name, module in self.model.named_modules():
                state = getattr(module, "_get_fsdp_state", None)
                group = state()._fsdp_param_group if state else None
                if group is not None:
                    names[id(group)] = state_names[id(state())] = name or "root"
        self._saved = {key: getattr(dist, attr) for key, attr in _WRAPPED.items()}
        self._saved["unshard"] = FSDPParamGroup.unshard
        self._saved["pre_backward"] = FSDPState._pre_backward
        log, saved = self, self._saved

        def pre_backward(state: Any, grad: Any) -> Any:
            grad = saved["pre_backward"](state, grad)  # unshard, then prefetch
            if id(state) in state_names:  # its backward computation starts now
                log.mark(f"compute {state_names[id(state)]}")
            return grad

        def unshard(group: Any, *args: Any, **kwargs: Any) -> Any:
            log._unit.append(names.get(id(group), "?"))
            try:
                return saved["unshard"](group, *args, **kwargs)
            finally:
                log._unit.pop()

        def all_gather(output, input, group=None, async_op=False):  # noqa: A002
            log._record("all-gather", output, group)
            return saved["all-gather"](output, input, group=group, async_op=async_op)

        def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, **kw):  # noqa: A002
            log._record("reduce-scatter", input, group)
            return saved["reduce-scatter"](
                output=output, input=input, op=op, group=group, **kw
            )

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            log._record("all-reduce", tensor, group)
            return saved["all-reduce"](tensor, op=op, group=group, async_op=async_op)

        dist.all_gather_single = all_gather
        dist.reduce_scatter_single = reduce_scatter
        dist.all_reduce = all_reduce
        FSDPParamGroup.unshard = unshard
        FSDPState._pre_backward = pre_backward  # hooked on outputs in each forward
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import (
            FSDPParamGroup,
        )

        for key, attr in _WRAPPED.items():
            setattr(dist, attr, self._saved[key])
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        FSDPParamGroup.unshard = self._saved["unshard"]
        FSDPState._pre_backward = self._saved["pre_backward"]


def _storage_bytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    return tensor.untyped_storage().nbytes()


def fsdp_params(model: nn.Module) -> list[Any]:
    """FSDP2's per-parameter records (``FSDPParam``) of every unit of ``model``,
    each once (14b)."""
    records = []
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state else None
        if group is not None:
            records.extend(group.fsdp_params)
    return records


def parameter_bytes_held(model: nn.Module) -> dict[str, int]:
    """Bytes of parameter storage this rank holds now, by kind: ``sharded`` (its
    padded shards), ``unsharded`` (all-gather outputs not yet freed),
    ``post-forward`` (reshard_after_forward=k's smaller shards) (14b)."""
    held = {"sharded": 0, "unsharded": 0, "post-forward": 0}
    for record in fsdp_params(model):
        held["sharded"] += _storage_bytes(record._sharded_param_data)
        held["unsharded"] += sum(map(_storage_bytes, record.all_gather_outputs))
        post = getattr(record, "_sharded_post_forward_param_data", None)
        held["post-forward"] += _storage_bytes(post)
    return held


def local_parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank stores: each DTensor's local shard, a
    plain tensor whole; a meta tensor holds none (14b)."""
    total = 0
    for parameter in model.parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        if local.device.type != "meta":
            total += local.numel() * local.element_size()
    return total
