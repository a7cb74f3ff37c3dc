"""FSDP by hand: units, prefetch, mixed precision, activation checkpointing (14).

Taught in ``notebooks/14_fsdp_by_hand.ipynb``; it builds on 13's ZeRO-3
(:mod:`multigpu.zero`), the flat buffers and the hand-written all-gather and
reduce-scatter (:mod:`multigpu.collectives`):

- :mod:`~multigpu.fsdp.models`: a model with a tied, a frozen and an unused layer;
- :mod:`~multigpu.fsdp.units`: which modules form a unit, its flat shard;
- :mod:`~multigpu.fsdp.stream`: a communication thread, the CPU's second stream;
- :mod:`~multigpu.fsdp.prefetch`: issue the next units' all-gathers early;
- :mod:`~multigpu.fsdp.mixed_precision`: cast before the all-gather, reduce in fp32;
- :mod:`~multigpu.fsdp.sharded`: :class:`FSDPByHand`, the hooks that put it together;
- :mod:`~multigpu.fsdp.hooks`: the four hooks of one unit, plainly (the exercise);
- :mod:`~multigpu.fsdp.train`: a rank's training loop;
- :mod:`~multigpu.fsdp.timeline`: a unit's life, what communication hid behind compute;
- :mod:`~multigpu.fsdp.checkpointing`: activation checkpointing, saved bytes counted.

The formulas are in :mod:`multigpu.costmodel.fsdp`, the rank functions in
:mod:`multigpu.ranks.fsdp`, the checkers in :mod:`multigpu.exercises.fsdp`, the
figures in :mod:`multigpu.plots.fsdp`.
"""

from multigpu.fsdp.checkpointing import (
    CheckpointedStack,
    ResidualBlock,
    SavedActivations,
    make_block_stack,
    parameter_storages,
)
from multigpu.fsdp.hooks import HookedFSDP, HookedUnit, UnitHooks
from multigpu.fsdp.mixed_precision import gather_parameters, reduce_gradient
from multigpu.fsdp.models import TiedFrozenNet
from multigpu.fsdp.prefetch import issue_with_prefetch
from multigpu.fsdp.sharded import FSDPByHand
from multigpu.fsdp.stream import CommStream, Handle
from multigpu.fsdp.timeline import gather_hidden_share, step_seconds, unit_life
from multigpu.fsdp.train import (
    FSDPHistory,
    train_fsdp,
    train_fsdp2_mixed,
    train_ranks_arithmetic_adam,
    train_unit_hooks,
)
from multigpu.fsdp.units import FlatUnit, check_units, plan_units

__all__ = [
    "CheckpointedStack",
    "CommStream",
    "FSDPByHand",
    "FSDPHistory",
    "FlatUnit",
    "Handle",
    "HookedFSDP",
    "HookedUnit",
    "ResidualBlock",
    "SavedActivations",
    "TiedFrozenNet",
    "UnitHooks",
    "check_units",
    "gather_hidden_share",
    "gather_parameters",
    "issue_with_prefetch",
    "make_block_stack",
    "parameter_storages",
    "plan_units",
    "reduce_gradient",
    "step_seconds",
    "train_fsdp",
    "train_fsdp2_mixed",
    "train_ranks_arithmetic_adam",
    "train_unit_hooks",
    "unit_life",
]
