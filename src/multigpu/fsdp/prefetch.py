"""Prefetch: issue the next units' all-gathers before they are needed (14).

Before a unit computes, :func:`issue_with_prefetch` issues its own all-gather (if
a prefetch has not already issued it), then the all-gathers of the next
``wrapper.depth`` units in ``order`` WITHOUT waiting for them, and only then waits
for its own. The communication thread runs them while this unit computes; each
costs the memory of one more gathered unit. ``order`` is this step's: the units
its forward (or backward) has run so far, then the others as the last forward ran
them (reversed in backward). FSDP2
(``torch/distributed/fsdp/_fully_shard/``) prefetches one unit ahead in backward by
default (``FSDPParamGroup._backward_prefetch`` in ``_fsdp_param_group.py``, the
reverse of the recorded post-forward order); in forward it issues nothing early
unless asked (``set_modules_to_forward_prefetch`` in ``_fully_shard.py``): on a GPU
the CPU runs ahead of the kernels, so the next unit's all-gather, on its own
stream, already overlaps this unit's compute.
"""

from __future__ import annotations

from typing import Protocol


class Gatherer(Protocol):
    """What a prefetch function may use (an :class:`~multigpu.fsdp.FSDPByHand`)."""

    depth: int

    def issue_gather(self, unit: int): ...


def issue_with_prefetch(wrapper: Gatherer, order: list[int], position: int) -> None:
    """Unit ``order[position]`` is about to compute: issue its all-gather, issue
    the next ``wrapper.depth`` units' without waiting, then wait for its own (14)."""
    handle = wrapper.issue_gather(order[position])  # queued first: needed first
    for unit in order[position + 1 : position + 1 + wrapper.depth]:
        wrapper.issue_gather(unit)  # keep going: it runs while this unit computes
    handle.wait()
