"""Sharding the model: ZeRO-1, -2 and -3 by hand, then FSDP2 (13).

Taught in ``notebooks/13_sharding_zero_fsdp.ipynb``. Data parallelism (08, 09) keeps
a whole copy of the training state on every rank. With Adam that is, per parameter,
its value, its gradient and two moments: 4 + 4 + 8 = 16 bytes in float32. ZeRO
("Zero Redundancy Optimizer", Rajbhandari et al., 2020) removes the copies step by
step: ZeRO-1 shards the optimizer state over the N ranks, ZeRO-2 the gradients too,
ZeRO-3 the parameters too (4 + 4 + 8/N, 4 + 12/N and 16/N bytes per parameter in
float32). These formulas, the table behind them and the bytes each stage sends are
in :mod:`multigpu.costmodel` (``ZERO_STAGES``, ``LEDGER_CATEGORIES``,
``zero_bytes_per_parameter``, ``zero_memory_ledger``, ``zero_bytes_sent_theory``,
``zero_bytes_sent_per_rank``).

All stages train with Adam, built from the hand-written collectives of
:mod:`multigpu.collectives`:

- :mod:`~multigpu.zero.flat`: DDP, ZeRO-1 and ZeRO-2 on one flat buffer;
- :mod:`~multigpu.zero.zero3`: ZeRO-3, a Linear layer that keeps only its chunk;
- :mod:`~multigpu.zero.ledger`: the bytes a rank holds, measured;
- :mod:`~multigpu.zero.loop`: the model, the data, one process, a stage on a rank;
- :mod:`~multigpu.zero.fsdp2`: PyTorch's FSDP2 and its sharded checkpoints.

The rank functions and their launchers (``compare_stages``, ``train_fsdp2``,
``load_fsdp2_checkpoint``) are in :mod:`multigpu.ranks.zero`; the exercise's
checker is :func:`multigpu.exercises.zero.check_zero2_step`.
"""

from multigpu.zero.flat import (
    STEPS,
    ShardedStep,
    ddp_flat_step,
    flatten_parameters,
    pop_flat_gradients,
    shard_of,
    trainable_parameters,
    zero1_step,
    zero2_step,
)
from multigpu.zero.fsdp2 import (
    check_checkpoint_dir,
    describe_shards,
    full_parameters,
    fully_shard_model,
    layers_to_shard,
    load_sharded_checkpoint,
    shard_linears_and_root,
)
from multigpu.zero.ledger import layer_numels, measure_ledger, storage_bytes
from multigpu.zero.loop import (
    Batch,
    ShardedHistory,
    check_same_step_counts,
    make_data,
    make_mlp,
    train_one_process_adam,
    train_stage,
)
from multigpu.zero.zero3 import (
    AllGatherLinear,
    Meter,
    ShardedLinear,
    agree_on,
    check_shardable,
    gathered_state_dict,
    shard_model,
)

__all__ = [
    "STEPS",
    "AllGatherLinear",
    "Batch",
    "Meter",
    "ShardedHistory",
    "ShardedLinear",
    "ShardedStep",
    "agree_on",
    "check_checkpoint_dir",
    "check_same_step_counts",
    "check_shardable",
    "ddp_flat_step",
    "describe_shards",
    "flatten_parameters",
    "full_parameters",
    "fully_shard_model",
    "layers_to_shard",
    "shard_linears_and_root",
    "gathered_state_dict",
    "layer_numels",
    "load_sharded_checkpoint",
    "make_data",
    "make_mlp",
    "measure_ledger",
    "pop_flat_gradients",
    "shard_model",
    "shard_of",
    "storage_bytes",
    "train_one_process_adam",
    "train_stage",
    "trainable_parameters",
    "zero1_step",
    "zero2_step",
]
