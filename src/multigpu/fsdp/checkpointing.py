"""Activation checkpointing on a stack of blocks, and the activations it saves (14).

Backward needs tensors that forward computed: autograd saves them (``ctx.
save_for_backward``) and holds them from forward to backward. ``torch.utils.
checkpoint.checkpoint(block, h, use_reentrant=False)`` keeps only the block's input
and recomputes the block's forward in backward, to get the rest back
(``torch/utils/checkpoint.py``: ``_checkpoint_without_reentrant_generator`` saves
the inputs, then packs every other tensor as a placeholder).
:class:`CheckpointedStack` checkpoints segments of ``segment`` blocks, one segment
in every ``every`` (0: none). :class:`SavedActivations` counts the bytes saved for
backward with ``torch.autograd.graph.saved_tensors_hooks``: each buffer once, from
the moment it is saved until autograd lets go of it, parameters left out. The
tensors a checkpointed segment saves again when backward recomputes it are
counted too (the stack passes checkpoint a ``context_fn`` whose recomputation
context adds the counter's pack hook on top of checkpoint's own,
``_recomputation_hook``), so ``peak_bytes`` is the peak over forward and backward.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class ResidualBlock(nn.Module):
    """h + W2·tanh(W1·h + b1) + b2, (B, width) -> (B, width), 4·width inside; it
    saves its input (B, width) and the tanh (B, 4·width): 5·B·width numbers (14)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.tanh(self.up(h)))


class CheckpointedStack(nn.Sequential):
    """Blocks run in order; they are cut into segments of ``segment`` blocks, and
    one segment in every ``every`` (the first, the ``every``-th, ...) runs under
    ``checkpoint``; ``every=0`` checkpoints nothing (14)."""

    def __init__(self, blocks: list[nn.Module], every: int = 0, segment: int = 1):
        super().__init__(*blocks)
        self.every, self.segment = every, segment

    def segments(self) -> list[tuple[list[nn.Module], bool]]:
        """(blocks, checkpointed?) per segment, in order."""
        blocks = list(self)
        cuts = range(0, len(blocks), self.segment)
        return [
            (blocks[i : i + self.segment], self.every > 0 and j % self.every == 0)
            for j, i in enumerate(cuts)
        ]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for blocks, checkpointed in self.segments():
            run = nn.Sequential(*blocks)  # no parameters of its own
            if checkpointed:  # context_fn: only so that recomputation is counted
                h = checkpoint(run, h, use_reentrant=False, context_fn=_counting)
            else:
                h = run(h)
        return h


def make_block_stack(
    blocks: int, width: int, every: int = 0, segment: int = 1, dtype=torch.float32
) -> CheckpointedStack:
    """A :class:`CheckpointedStack` of ``blocks`` :class:`ResidualBlock` s (14)."""
    stack = CheckpointedStack([ResidualBlock(width) for _ in range(blocks)])
    stack.every, stack.segment = every, segment
    return stack.to(dtype)


class SavedActivations:
    """A context in which every tensor autograd saves is counted: ``alive_bytes``
    now, ``peak_bytes`` at most, through the backward that follows (a
    :class:`CheckpointedStack`'s recomputation included); each buffer once; a
    tensor for which ``is_parameter`` is true is left out (:func:`parameter_storages`:
    one that shares memory with a parameter, e.g. ``weight.t()``, which Linear
    saves) (14)."""

    def __init__(self, is_parameter: Callable[[torch.Tensor], bool]) -> None:
        self.is_parameter = is_parameter
        self.alive_bytes = self.peak_bytes = 0
        self.holders: dict[int, int] = {}  # buffer address -> tensors holding it
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, tensor: torch.Tensor):
        if self.is_parameter(tensor):
            return tensor
        held = _Held(tensor)
        self.count(tensor, held)
        return held

    def count(self, tensor: torch.Tensor, holder: object) -> None:
        """Count ``tensor``'s buffer as alive until ``holder`` is dropped."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.holders:
            self.holders[key] = 0
            self.alive_bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.alive_bytes)
        self.holders[key] += 1
        weakref.finalize(holder, self.release, key, storage.nbytes())

    def release(self, key: int, nbytes: int) -> None:
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.alive_bytes -= nbytes

    @staticmethod
    def unpack(packed):
        return packed.tensor if isinstance(packed, _Held) else packed

    def __enter__(self) -> SavedActivations:
        self.hooks.__enter__()
        _COUNTERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _COUNTERS.remove(self)
        self.hooks.__exit__(*exc)


_COUNTERS: list[SavedActivations] = []  # the counters entered, innermost last


class _CountRecomputed(torch.autograd.graph.saved_tensors_hooks):
    """Entered by checkpoint around a segment's recomputation, inside its own
    ``_recomputation_hook``: each tensor goes on to that hook (which keeps it until
    backward uses it), and what it keeps is counted until it is dropped."""

    def __init__(self, counter: SavedActivations) -> None:
        self.outer = None

        def pack(tensor: torch.Tensor):
            kept = self.outer[0](tensor.detach())  # a new alias: dropped with it
            if not counter.is_parameter(tensor):
                counter.count(tensor, kept)
            return kept

        super().__init__(pack, lambda packed: self.outer[1](packed))

    def __enter__(self):
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        self.outer = top or (lambda t: t, lambda t: t)
        return super().__enter__()


def _counting():
    """checkpoint's ``context_fn``: nothing in forward; in recomputation, count
    for the :class:`SavedActivations` entered when forward ran, if any."""
    recompute = _CountRecomputed(_COUNTERS[-1]) if _COUNTERS else None
    return contextlib.nullcontext(), recompute or contextlib.nullcontext()


def parameter_storages(parameters) -> Callable[[torch.Tensor], bool]:
    """A test for :class:`SavedActivations`: does a tensor share memory with one of
    ``parameters`` (14)?"""
    addresses = {p.untyped_storage().data_ptr() for p in parameters}
    return lambda tensor: tensor.untyped_storage().data_ptr() in addresses


class _Held:
    """A saved tensor; when autograd drops it, its finalizer releases the bytes."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
