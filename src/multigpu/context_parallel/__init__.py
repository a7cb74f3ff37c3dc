"""Context parallelism: the sequence split over ranks inside attention (17).

Taught in ``notebooks/17_context_parallel.ipynb``; builds on the send/recv and ring
all-reduce of :mod:`multigpu.collectives` (07). Each rank holds some of the
sequence's tokens; everything but attention is per token, and attention is split
in one of two ways:

- :mod:`~multigpu.context_parallel.attention`: attention in one process, over one
  block of keys (output and log-sum-exp), the merge of two partial results, the
  causal rule for a block, and a block's backward;
- :mod:`~multigpu.context_parallel.layout`: which tokens a rank holds, contiguous
  or zig-zag;
- :mod:`~multigpu.context_parallel.ring`: ring attention on ranks, forward and
  backward (an autograd Function), and played in one process;
- :mod:`~multigpu.context_parallel.ulysses`: Ulysses' all-to-alls from a split
  sequence to split heads and back;
- :mod:`~multigpu.context_parallel.step`: a forward and backward on ranks, and the
  results put back in sequence order;
- :mod:`~multigpu.context_parallel.block`: a self-attention block trained under
  context parallelism (weights replicated, gradients all-reduced), and the bytes
  autograd saves;
- :mod:`~multigpu.context_parallel.torch_api`: PyTorch's ``context_parallel`` on
  CPU ranks.

The formulas (bytes, blocks, activations) are in
:mod:`multigpu.costmodel.context_parallel`; the ranks and launchers in
:mod:`multigpu.ranks.context_parallel`; the figures in
:mod:`multigpu.plots.context_parallel`; the checkers in
:mod:`multigpu.exercises.context_parallel`.
"""

from multigpu.context_parallel.attention import (
    BLOCK_KINDS,
    block_attention,
    block_attention_backward,
    causal_block_kind,
    merge_partials,
    reference_attention,
)
from multigpu.context_parallel.block import (
    AttentionBlock,
    SavedBytes,
    broadcast_parameters,
    cp_block_step,
    make_attention_block,
    one_process_block_step,
)
from multigpu.context_parallel.layout import (
    LAYOUTS,
    check_layout,
    chunks_of,
    layout_chunks,
    layout_positions,
    shard_sequence,
    unshard_sequence,
)
from multigpu.context_parallel.ring import (
    BlockRecord,
    RingAttention,
    RingRecord,
    attend_to_block,
    ring_attention,
    ring_attention_backward,
    ring_attention_forward,
    simple_ring_attention,
    simulate_ring_attention,
)
from multigpu.context_parallel.step import (
    SCHEMES,
    AttentionCase,
    AttentionRun,
    attention_step,
    make_attention_case,
    merge_attention_results,
    one_process_attention,
)
from multigpu.context_parallel.torch_api import (
    torch_context_parallel_attention,
    torch_head_tail_positions,
)
from multigpu.context_parallel.ulysses import (
    UlyssesRecord,
    check_ulysses,
    heads_to_sequence,
    sequence_to_heads,
    ulysses_attention,
)

__all__ = [
    "BLOCK_KINDS",
    "LAYOUTS",
    "SCHEMES",
    "AttentionBlock",
    "AttentionCase",
    "AttentionRun",
    "BlockRecord",
    "RingAttention",
    "RingRecord",
    "SavedBytes",
    "UlyssesRecord",
    "attend_to_block",
    "attention_step",
    "block_attention",
    "block_attention_backward",
    "broadcast_parameters",
    "causal_block_kind",
    "check_layout",
    "check_ulysses",
    "chunks_of",
    "cp_block_step",
    "heads_to_sequence",
    "layout_chunks",
    "layout_positions",
    "make_attention_block",
    "make_attention_case",
    "merge_attention_results",
    "merge_partials",
    "one_process_attention",
    "one_process_block_step",
    "reference_attention",
    "ring_attention",
    "ring_attention_backward",
    "ring_attention_forward",
    "sequence_to_heads",
    "shard_sequence",
    "simple_ring_attention",
    "simulate_ring_attention",
    "torch_context_parallel_attention",
    "torch_head_tail_positions",
    "ulysses_attention",
    "unshard_sequence",
]
