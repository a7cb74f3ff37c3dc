"""FSDP2 in practice: its knobs one by one, each measured (14b).

Taught in ``notebooks/14b_fsdp2_in_practice.ipynb``; it builds on notebook 14
(FSDP by hand) and on 13's ``fully_shard`` (:mod:`multigpu.zero.fsdp2`). Every
knob runs on CPU ranks with gloo (torch 2.14.1):

- :mod:`~multigpu.fsdp2.sharding`: an explicit CPU mesh (1-D, or 2-D for HSDP),
  ``fully_shard`` per layer with ``reshard_after_forward`` and
  ``MixedPrecisionPolicy``, explicit prefetching, meta-device construction, the
  full state dict for export;
- :mod:`~multigpu.fsdp2.counting`: the collectives FSDP2 issues, counted, and the
  parameter bytes a rank holds;
- :mod:`~multigpu.fsdp2.loop`: one loop for one process and for a rank, with
  gradient accumulation (``set_requires_gradient_sync``) and clipping;
- :mod:`~multigpu.fsdp2.memory`: a step's peak memory per rank, by kind
  (PyTorch's ``FSDPMemTracker``), and the knobs that shape it on a stack of blocks.

The formulas are in :mod:`multigpu.costmodel.fsdp2`; the rank functions in
:mod:`multigpu.ranks.fsdp2`; the exercises' checkers are
:func:`multigpu.exercises.fsdp2.check_accumulation_step`,
:func:`multigpu.exercises.fsdp2.check_build_sharded` and
:func:`multigpu.exercises.fsdp2.check_wrap_within_budget`; the figure is
:func:`multigpu.plots.fsdp2.plot_hsdp_mesh`.
"""

from multigpu.fsdp2.counting import (
    CollectiveLog,
    fsdp_params,
    local_parameter_bytes,
    parameter_bytes_held,
)
from multigpu.fsdp2.loop import (
    MicroBatch,
    StepsResult,
    make_optimizer,
    rank_part,
    train_one_process,
    train_steps,
)
from multigpu.fsdp2.memory import (
    SavedInsideBlocks,
    budget_model,
    shard_blocks,
    step_peak,
    unsharded_gradient_bytes,
)
from multigpu.fsdp2.sharding import (
    build_on_meta,
    cpu_mesh,
    full_state_dict,
    load_full_state_dict,
    set_prefetch,
    shard_layers,
)
from multigpu.zero import full_parameters, layers_to_shard  # 13's, used in 14b too

__all__ = [
    "full_parameters",
    "CollectiveLog",
    "MicroBatch",
    "SavedInsideBlocks",
    "StepsResult",
    "budget_model",
    "build_on_meta",
    "cpu_mesh",
    "fsdp_params",
    "full_state_dict",
    "layers_to_shard",
    "load_full_state_dict",
    "local_parameter_bytes",
    "make_optimizer",
    "parameter_bytes_held",
    "rank_part",
    "set_prefetch",
    "shard_blocks",
    "shard_layers",
    "step_peak",
    "train_one_process",
    "train_steps",
    "unsharded_gradient_bytes",
]
