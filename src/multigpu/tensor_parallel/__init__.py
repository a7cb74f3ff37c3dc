"""Tensor and sequence parallelism by hand, on the collectives of notebook 07 (15).

Taught in ``notebooks/15_tensor_and_sequence_parallel.ipynb``; builds on
:mod:`multigpu.collectives` (07). One file per concept:

- :mod:`~multigpu.tensor_parallel.operators`: Megatron's conjugate operators f and
  g and their sequence-parallel versions as autograd Functions, and the ledger of
  the collectives they run;
- :mod:`~multigpu.tensor_parallel.layers`: column- and row-parallel linear layers;
- :mod:`~multigpu.tensor_parallel.model`: the one-process block and tiny LM;
- :mod:`~multigpu.tensor_parallel.blocks`: the tensor-parallel MLP, attention and
  block, sequence parallelism, the sharding of a one-process state;
- :mod:`~multigpu.tensor_parallel.vocab`: vocabulary-parallel embedding and
  cross-entropy;
- :mod:`~multigpu.tensor_parallel.compare`: one process as the reference;
- :mod:`~multigpu.tensor_parallel.memory`: the activation bytes autograd saves;
- :mod:`~multigpu.tensor_parallel.dtensor`: the same with PyTorch's DTensor API.

The ranks are in :mod:`multigpu.ranks.tensor_parallel`, the formulas in
:mod:`multigpu.costmodel.tensor_parallel`.
"""

from multigpu.tensor_parallel.blocks import (
    TensorParallelAttention,
    TensorParallelBlock,
    TensorParallelMLP,
    shard_block_state,
    sync_sequence_parallel_grads,
)
from multigpu.tensor_parallel.compare import (
    block_distances,
    max_difference,
    one_process_block,
    one_process_sgd,
)
from multigpu.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    check_splittable,
    column_shard,
    mark_sequence_parallel,
    row_parallel_linear,
    row_shard,
)
from multigpu.tensor_parallel.memory import saved_activation_bytes
from multigpu.tensor_parallel.model import (
    MLP,
    Attention,
    Block,
    TinyLM,
    causal_attention,
    dropout_mask,
    make_block,
)
from multigpu.tensor_parallel.operators import (
    CollectiveRecord,
    CopyToTensorParallel,
    GatherFromSequenceParallel,
    ReduceFromTensorParallel,
    ReduceScatterToSequenceParallel,
    all_reduce_max,
    all_reduce_sum,
    check_divisible,
    count_communication,
    record_collectives,
    sequence_chunk,
)
from multigpu.tensor_parallel.vocab import (
    TensorParallelLM,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    shard_lm_state,
    vocab_parallel_cross_entropy,
    vocab_parallel_token_losses,
    vocab_start,
)

__all__ = [
    "MLP",
    "Attention",
    "Block",
    "CollectiveRecord",
    "ColumnParallelLinear",
    "CopyToTensorParallel",
    "GatherFromSequenceParallel",
    "ReduceFromTensorParallel",
    "ReduceScatterToSequenceParallel",
    "RowParallelLinear",
    "TensorParallelAttention",
    "TensorParallelBlock",
    "TensorParallelLM",
    "TensorParallelMLP",
    "TinyLM",
    "VocabParallelCrossEntropy",
    "VocabParallelEmbedding",
    "all_reduce_max",
    "all_reduce_sum",
    "block_distances",
    "causal_attention",
    "check_divisible",
    "check_splittable",
    "column_shard",
    "count_communication",
    "dropout_mask",
    "make_block",
    "max_difference",
    "one_process_block",
    "one_process_sgd",
    "mark_sequence_parallel",
    "record_collectives",
    "row_parallel_linear",
    "row_shard",
    "saved_activation_bytes",
    "sequence_chunk",
    "shard_block_state",
    "shard_lm_state",
    "sync_sequence_parallel_grads",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_token_losses",
    "vocab_start",
]
