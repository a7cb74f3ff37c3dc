"""A rank's memory in one FSDP2 step, measured: the peak of every tensor it holds,
by kind, the gradients accumulation keeps whole, and what a block saves for
backward (14b).

:func:`step_peak` runs training steps under PyTorch's ``FSDPMemTracker``
(``torch/distributed/_tools/fsdp2_mem_tracker.py``): a dispatch mode that sees
every tensor a rank creates and sorts its bytes into kinds (parameter shards,
all-gathered parameters, gradients, activations, ...); on a CPU it counts each
storage's exact bytes; :class:`CollectivesOnCopies` keeps gloo's background
thread from freeing a counted tensor at a moment that varies from run to run, so
the peak is the same on every run. :func:`budget_model` is the stack of 14's
residual blocks whose peak notebook 14b's exercise 3 fits under a budget, and
:func:`shard_blocks` the knobs that shape it: activation checkpointing of each
block, ``fully_shard`` per block and on the root, with ``reshard_after_forward``
and ``mp_policy``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.fsdp import ResidualBlock
from multigpu.fsdp2.counting import fsdp_params
from multigpu.fsdp2.loop import MicroBatch
from multigpu.fsdp2.sharding import cpu_mesh

# FSDPMemTracker's kinds (``_FSDPRefType``), in the words the lesson uses
KINDS = {
    "Sharded Param": "parameter shards",
    "Unsharded Param": "parameters all-gathered",
    "All Gather": "parameters all-gathered",
    "Sharded Grad": "gradient shards",
    "Unsharded Grad": "gradients before reduce-scatter",
    "Reduce Scatter": "gradients before reduce-scatter",
    "Activation": "activations",
    "Temp": "temporaries",
    "OptState": "optimizer state",
    "Buffer": "buffers",
    "Inputs": "inputs",
}
BUDGET_SIZES = (32, 64, 6, 10)  # inputs, width, blocks, classes


def budget_model(sizes: Sequence[int] = BUDGET_SIZES, seed: int = 0) -> nn.Sequential:
    """Linear(inputs, width), ``blocks`` of 14's :class:`~multigpu.fsdp.ResidualBlock`
    (width), Linear(width, classes), float32, seeded (14b)."""
    inputs, width, blocks, classes = sizes
    torch.manual_seed(seed)
    layers = [nn.Linear(inputs, width)]
    layers += [ResidualBlock(width) for _ in range(blocks)]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def shard_blocks(
    model: nn.Module,
    mesh: Any = None,
    checkpoint_blocks: bool = False,
    **knobs: Any,
) -> nn.Module:
    """Each :class:`~multigpu.fsdp.ResidualBlock` of ``model`` checkpointed (if
    ``checkpoint_blocks``) and made a unit, then the root; ``knobs`` go to every
    ``fully_shard`` call (``reshard_after_forward``, ``mp_policy``) (14b)."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    mesh = mesh if mesh is not None else cpu_mesh()
    for block in model.modules():
        if isinstance(block, ResidualBlock):
            if checkpoint_blocks:
                checkpoint(block)  # keeps the block's input, recomputes the rest
            fully_shard(block, mesh=mesh, **knobs)
    fully_shard(model, mesh=mesh, **knobs)
    return model


def step_peak(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[MicroBatch],
) -> dict[str, int]:
    """Train ``model`` (an FSDP2 root) one step per batch under ``FSDPMemTracker``:
    the bytes this rank held at its peak, by kind ("total" and :data:`KINDS`'
    words); inputs prepared before, so not counted; the collectives run as in
    :class:`CollectivesOnCopies` (14b)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = FSDPMemTracker(model, optimizer)
    with CollectivesOnCopies(tracker), tracker:
        for inputs, labels in batches:
            logits = model(inputs)
            F.cross_entropy(logits.float(), labels).backward()
            optimizer.step()
            optimizer.zero_grad()
            tracker.reset_mod_stats()  # the tracker follows one step at a time
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()  # one device
    peak = {"total": 0}
    for kind, nbytes in snapshot.items():
        name = getattr(kind, "value", kind)
        if name == "Total":
            peak["total"] = nbytes
        elif nbytes:
            peak[KINDS.get(name, name)] = peak.get(KINDS.get(name, name), 0) + nbytes
    return peak


class CollectivesOnCopies:
    """Inside it, the three ``torch.distributed`` collectives FSDP2 calls run to
    completion before they return, on copies made outside any dispatch mode: gloo's
    background thread never holds a tensor the memory tracker counts, so no tensor
    is freed at a moment that differs from run to run. ``tracker``: an
    ``FSDPMemTracker`` whose own rule (``__torch_dispatch__``) still labels the
    all-gather outputs and reduce-scatter inputs it no longer sees (14b)."""

    NAMES = ("all_gather_single", "reduce_scatter_single", "all_reduce")

    def __init__(self, tracker: Any = None) -> None:
        self.tracker = tracker

    def _label(self, tensor: torch.Tensor, kind: str, states: Sequence[str]) -> None:
        from torch.distributed._tools import fsdp2_mem_tracker as mem

        tracker = self.tracker
        if tracker is not None and tracker._fsdp_state.name in states:
            kind = getattr(mem._FSDPRefType, kind)
            tracker._update_and_maybe_create_winfos(tensor, kind, update_existing=True)

    def __enter__(self) -> CollectivesOnCopies:
        from torch.utils._python_dispatch import _disable_current_modes as untracked

        self._saved = {name: getattr(dist, name) for name in self.NAMES}
        saved, label = self._saved, self._label

        def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
            label(output_tensor, "ALL_GATHER", ("PRE_FW", "PRE_BW"))
            with untracked():
                output = torch.empty_like(output_tensor)
                saved["all_gather_single"](output, input_tensor.clone(), group=group)
                output_tensor.copy_(output)

        def reduce_scatter_single(
            output, input, op=dist.ReduceOp.SUM, group=None, async_op=False
        ):  # noqa: A002
            label(input, "REDUCE_SCATTER", ("POST_BW",))
            with untracked():
                result = torch.empty_like(output)
                saved["reduce_scatter_single"](
                    result, input.clone(), op=op, group=group
                )
                output.copy_(result)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            with untracked():
                result = tensor.clone()
                saved["all_reduce"](result, op=op, group=group)
                tensor.copy_(result)

        dist.all_gather_single = all_gather_single
        dist.reduce_scatter_single = reduce_scatter_single
        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, function in self._saved.items():
            setattr(dist, name, function)


def unsharded_gradient_bytes(model: nn.Module) -> dict[str, Any]:
    """Bytes of unsharded gradients this rank's FSDP2 units hold now (gradients
    accumulated without a reduce-scatter), and their dtypes (14b)."""
    held, dtypes = 0, set()
    for record in fsdp_params(model):
        unsharded = getattr(record, "_unsharded_param", None)  # after 1st gather
        grads = (record.unsharded_accumulated_grad, getattr(unsharded, "grad", None))
        for grad in grads:
            if grad is not None:
                held += grad.untyped_storage().nbytes()
                dtypes.add(str(grad.dtype).replace("torch.", ""))
    return {"bytes": held, "dtypes": sorted(dtypes)}


class SavedInsideBlocks:
    """Inside ``with SavedInsideBlocks(model) as saved:`` the bytes autograd saves
    for backward while a :class:`~multigpu.fsdp.ResidualBlock` runs forward,
    outside any activation checkpoint (a checkpoint's own hooks take what it
    saves), counted per block in ``saved.blocks`` (14b)."""

    def __init__(self, model: nn.Module) -> None:
        self.blocks: dict[int, int] = {}
        self._inside: list[int] = []
        self._handles: list[Any] = []
        self._model = model
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._inside and not isinstance(tensor, nn.Parameter):
            key = self._inside[-1]
            self.blocks[key] = self.blocks.get(key, 0) + tensor.nbytes
        return tensor

    def __enter__(self) -> SavedInsideBlocks:
        blocks = [m for m in self._model.modules() if isinstance(m, ResidualBlock)]
        for index, block in enumerate(blocks):
            self.blocks[index] = 0
            self._handles.append(block.register_forward_pre_hook(self._enter(index)))
            self._handles.append(block.register_forward_hook(self._leave))
        self._hooks.__enter__()
        return self

    def _enter(self, index: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            if not _in_backward():  # a checkpoint's recomputation is not a forward
                self._inside.append(index)

        return hook

    def _leave(self, *_: Any) -> None:
        if not _in_backward():
            self._inside.pop()

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1
