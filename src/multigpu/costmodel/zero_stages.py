"""What each rank keeps and sends under the ZeRO stages (13).

The ring's two halves (``collectives.reduce_scatter`` and ``collectives.all_gather``)
each send every chunk once except one: (n-1)/n·S, half of a ring all-reduce
(:func:`reduce_scatter_bytes_per_rank`, :func:`all_gather_bytes_per_rank`).

ZeRO ("Zero Redundancy Optimizer", Rajbhandari et al., 2020) cuts Adam's training
state into N shards, one stage at a time. Each rank keeps, per parameter, in
float32 (value 4, gradient 4, Adam's two moments 8 bytes):

============  =================================  ========================
stage         what is cut into N shards          bytes per parameter (fp32)
============  =================================  ========================
``"DDP"``     nothing                            4 + 4 + 8 = 16
``"ZeRO-1"``  the optimizer state                4 + 4 + 8/N
``"ZeRO-2"``  optimizer state and gradients      4 + (4 + 8)/N
``"ZeRO-3"``  everything, parameters included    (4 + 4 + 8)/N
============  =================================  ========================

The paper's mixed-precision version keeps 2 + 2 + 12 (fp16 parameters and gradients;
an fp32 copy of the parameters and the two fp32 moments):
:func:`zero_bytes_per_parameter`, and times the parameter count
:func:`zero_memory_ledger`. What each stage sends per step, in passes of
(n-1)/n·S: :func:`zero_bytes_sent_theory`; counted chunk by chunk as
:mod:`multigpu.zero` sends it: :func:`zero_bytes_sent_per_rank`.
"""

from __future__ import annotations

from collections.abc import Sequence

from multigpu.core.checks import check_choice, check_positive_int
from multigpu.costmodel.communication import (
    all_gather_bytes_per_rank,
    reduce_scatter_bytes_per_rank,
    ring_bytes_per_rank,
)

# The ZeRO stages by what each rank keeps whole (13), the paper's two ways of
# counting bytes, and the rows of a memory ledger.
ZERO_STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
ZERO_PRECISIONS = ("fp32", "mixed")
LEDGER_CATEGORIES = ("parameters", "gradients", "optimizer", "gathered")


def zero_bytes_per_parameter(
    stage: str, world_size: int, precision: str = "fp32"
) -> dict[str, float]:
    """The ZeRO paper's bytes per parameter that each of ``world_size`` ranks
    keeps under ``stage``, by category: fp32 Adam 4 + 4 + 8, mixed precision
    2 + 2 + 12 (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    check_positive_int("world_size", world_size)
    check_choice("precision", precision, ZERO_PRECISIONS)
    parameters, gradients, optimizer = (4, 4, 8) if precision == "fp32" else (2, 2, 12)
    level = ZERO_STAGES.index(stage)  # 0 for DDP, 3 for ZeRO-3
    return {
        "parameters": parameters / (world_size if level >= 3 else 1),
        "gradients": gradients / (world_size if level >= 2 else 1),
        "optimizer": optimizer / (world_size if level >= 1 else 1),
        "gathered": 0.0,
    }


def zero_memory_ledger(
    stage: str,
    world_size: int,
    num_parameters: float,
    precision: str = "fp32",
    element_size: int = 4,
) -> dict[str, float]:
    """Bytes each rank keeps by category: :func:`zero_bytes_per_parameter` times
    ``num_parameters``; for fp32, ``element_size=8`` counts float64 instead
    (8 + 8 + 16) (13)."""
    per_parameter = zero_bytes_per_parameter(stage, world_size, precision)
    scale = element_size / 4 if precision == "fp32" else 1
    return {
        name: value * num_parameters * scale for name, value in per_parameter.items()
    }


def zero_bytes_sent_theory(stage: str, nbytes: float, world_size: int) -> float:
    """Bytes each rank sends per step for a model of ``nbytes`` of parameters:
    2(n-1)/n·S for DDP and ZeRO-2, 3(n-1)/n·S for ZeRO-1 (as :mod:`multigpu.zero`
    writes it: an all-reduce, then an all-gather) and ZeRO-3 (two all-gathers and a
    reduce-scatter) (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    check_positive_int("world_size", world_size)
    passes = 3 if stage in ("ZeRO-1", "ZeRO-3") else 2  # passes of (n-1)/n·S
    return passes * (world_size - 1) / world_size * nbytes


def zero_bytes_sent_per_rank(
    stage: str,
    layer_numels: Sequence[int],
    element_size: int,
    world_size: int,
    rank: int,
) -> int:
    """Exact bytes ``rank`` sends in one step of ``stage`` as :mod:`multigpu.zero`
    runs it, counted chunk by chunk; ``layer_numels`` are the parameters per layer
    (ZeRO-3 gathers layer by layer, the others move one flat buffer) (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    args = (element_size, world_size, rank)
    total = sum(layer_numels)
    if stage == "DDP":
        return ring_bytes_per_rank(total, *args)
    if stage == "ZeRO-1":
        return ring_bytes_per_rank(total, *args) + all_gather_bytes_per_rank(
            total, *args
        )
    if stage == "ZeRO-2":
        return reduce_scatter_bytes_per_rank(total, *args) + all_gather_bytes_per_rank(
            total, *args
        )
    return sum(
        2 * all_gather_bytes_per_rank(numel, *args)
        + reduce_scatter_bytes_per_rank(numel, *args)
        for numel in layer_numels
    )
