"""The conjugate operators of tensor and sequence parallelism, and their ledger (15).

Megatron-LM's f and g (Shoeybi et al. 2019, section 3), written as
``torch.autograd.Function``s on the collectives of notebook 07
(:mod:`multigpu.collectives`), and their sequence-parallel versions (Korthikanti et
al. 2022, section 4.2.2):

- :class:`CopyToTensorParallel` (f): identity forward, all-reduce backward;
- :class:`ReduceFromTensorParallel` (g): all-reduce forward, identity backward;
- :class:`GatherFromSequenceParallel`: all-gather along the sequence forward,
  reduce-scatter backward (in f's place under sequence parallelism; the paper's g);
- :class:`ReduceScatterToSequenceParallel`: reduce-scatter forward, all-gather
  backward (in g's place under sequence parallelism; the paper's ḡ).

Every collective they run is written to the ledger while :func:`record_collectives`
is open, with the bytes this rank sent, so tests count them against
:mod:`multigpu.costmodel.tensor_parallel`. Tensors are (batch, seq, hidden); the
sequence is dimension 1. :func:`count_communication` counts what any collective
moved, whichever API ran it (the checkers use it). Megatron's own versions are in
``megatron/core/tensor_parallel/mappings.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from multigpu.collectives import all_gather, reduce_scatter, ring_all_reduce

SEQUENCE_DIM = 1


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective a rank ran: its kind, the pass it ran in, the bytes sent."""

    kind: str  # "all-reduce", "all-gather", "reduce-scatter"
    phase: str  # "forward" or "backward"
    nbytes: int


_ledger: list[CollectiveRecord] | None = None


@contextlib.contextmanager
def record_collectives() -> Iterator[list[CollectiveRecord]]:
    """Collect every collective the operators run inside the block into the list
    it yields (15)."""
    global _ledger
    outer, _ledger = _ledger, []
    try:
        yield _ledger
    finally:
        _ledger = outer


def _note(kind: str, phase: str, nbytes: int) -> None:
    if _ledger is not None:
        _ledger.append(CollectiveRecord(kind, phase, nbytes))


class _CommunicationCounter(TorchDispatchMode):
    """Adds up the elements of the tensors that every c10d operation touches."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":  # send, recv_, allreduce_, allgather_, ...
            tensors = tree_leaves((args, kwargs))
            self.elements += sum(
                t.numel() for t in tensors if isinstance(t, torch.Tensor)
            )
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_communication() -> Iterator[_CommunicationCounter]:
    """Count, in ``.elements``, the tensor elements in the buffers of every
    collective and send/receive this process runs inside the block, whichever API
    called it (``dist.*``, 07's collectives, DTensor) (15)."""
    with _CommunicationCounter() as counter:
        yield counter


def check_divisible(what: str, size: int, world_size: int) -> None:
    """Refuse a dimension the tensor-parallel ranks cannot split evenly (15)."""
    if size % world_size:
        raise ValueError(
            f"{what}={size} is not divisible by the tensor-parallel world size "
            f"{world_size}. Choose a {what} that is a multiple of {world_size}, or "
            "run on a world size that divides it."
        )


def sequence_chunk(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s positions of x (batch, seq, ...) along the sequence: the input
    of a sequence-parallel block (15)."""
    check_divisible("seq", x.shape[SEQUENCE_DIM], world_size)
    return x.tensor_split(world_size, dim=SEQUENCE_DIM)[rank]


def all_reduce_sum(tensor: torch.Tensor, phase: str) -> torch.Tensor:
    """A new tensor: the sum of ``tensor`` over all ranks (ring all-reduce, 07)."""
    out = tensor.detach().clone().contiguous()
    _note("all-reduce", phase, ring_all_reduce(out))
    return out


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor: the element-wise maximum of ``tensor`` over all ranks, by an
    all-gather of every rank's values (07's collectives only sum) (15)."""
    world_size = dist.get_world_size()
    local = tensor.detach().contiguous()
    gathered = torch.empty(world_size * local.numel(), dtype=local.dtype)
    _note("all-gather", "forward", all_gather(gathered, local))
    return gathered.view(world_size, *local.shape).amax(dim=0)


def gather_sequence(local: torch.Tensor, phase: str) -> torch.Tensor:
    """(batch, seq/n, ...) on each rank -> (batch, seq, ...), rank order (15)."""
    world_size = dist.get_world_size()
    chunk = local.detach().movedim(SEQUENCE_DIM, 0).contiguous()  # (seq/n, b, ...)
    full = torch.empty(
        (world_size * chunk.shape[0], *chunk.shape[1:]), dtype=chunk.dtype
    )
    _note("all-gather", phase, all_gather(full, chunk))
    return full.movedim(0, SEQUENCE_DIM)


def reduce_scatter_sequence(full: torch.Tensor, phase: str) -> torch.Tensor:
    """(batch, seq, ...) partial sums -> this rank's (batch, seq/n, ...) of the sum."""
    world_size = dist.get_world_size()
    check_divisible("seq", full.shape[SEQUENCE_DIM], world_size)
    whole = full.detach().movedim(SEQUENCE_DIM, 0).contiguous()  # (seq, b, ...)
    chunk = torch.empty(
        (whole.shape[0] // world_size, *whole.shape[1:]), dtype=whole.dtype
    )
    _note("reduce-scatter", phase, reduce_scatter(chunk, whole))
    return chunk.movedim(0, SEQUENCE_DIM)


class CopyToTensorParallel(torch.autograd.Function):
    """f: every rank already holds the whole input; in backward each rank holds a
    partial gradient of it (from its shard of the weights): sum them (15)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(grad, "backward")


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: each rank holds a partial sum of the output: sum them; the gradient of a
    sum reaches every term unchanged (15)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(partial, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class GatherFromSequenceParallel(torch.autograd.Function):
    """f's place under sequence parallelism (Korthikanti et al.'s g): all-gather the
    sequence chunks forward; backward, sum the partial gradients and keep this
    rank's chunk (15)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        return gather_sequence(local, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_sequence(grad, "backward")


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """g's place under sequence parallelism (Korthikanti et al.'s ḡ): sum the
    partial outputs and keep this rank's sequence chunk; backward, all-gather the
    chunks' gradients (15)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_sequence(partial, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return gather_sequence(grad, "backward")
