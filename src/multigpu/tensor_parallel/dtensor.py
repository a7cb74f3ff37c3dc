"""The same splits with PyTorch's API: DTensor's ``parallelize_module`` (15).

The plans name, for each submodule of the one-process
:class:`~multigpu.tensor_parallel.model.Block`, the style that
``torch/distributed/tensor/parallel/style.py`` defines: ``ColwiseParallel`` for q,
k, v and fc1, ``RowwiseParallel`` for the output projection and fc2 (Megatron's
column and row split), and, for sequence parallelism, ``SequenceParallel`` on the
LayerNorms with ``PrepareModuleInput`` turning the sequence shards into a whole
input (an all-gather) and ``RowwiseParallel(output_layouts=Shard(1))`` producing
shards again (a reduce-scatter): :func:`mlp_plan`, :func:`sequence_parallel_plan`
and :func:`block_plan`, which joins them. :func:`parallelize_lm` adds a
vocabulary-parallel embedding and a head whose logits stay sharded for
``loss_parallel`` (``torch/distributed/tensor/parallel/loss.py``). Run inside a
process group.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def mlp_plan(
    prefix: str = "", sequence_parallel: bool = False
) -> dict[str, ParallelStyle]:
    """The plan of an MLP whose name is ``prefix``: fc1 cut by columns, fc2 by rows;
    under sequence parallelism fc2 reduce-scatters its output along the sequence
    (15)."""
    out = Shard(1) if sequence_parallel else Replicate()  # the sequence is dim 1
    return {
        f"{prefix}fc1": ColwiseParallel(),  # f on its input
        f"{prefix}fc2": RowwiseParallel(output_layouts=out),  # g on its output
    }


def sequence_parallel_plan(prefix: str = "") -> dict[str, ParallelStyle]:
    """What sequence parallelism adds to a Block's plan: LayerNorms on sequence
    shards, and an all-gather of the sequence into attention and the MLP (15)."""
    gather = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
    )
    return {
        f"{prefix}ln1": SequenceParallel(),
        f"{prefix}ln2": SequenceParallel(),
        f"{prefix}attn": gather,
        f"{prefix}mlp": gather,
    }


def block_plan(
    prefix: str = "", sequence_parallel: bool = False
) -> dict[str, ParallelStyle]:
    """The parallelize plan of a Block whose name is ``prefix`` (15)."""
    out = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {
        f"{prefix}attn.q": ColwiseParallel(),
        f"{prefix}attn.k": ColwiseParallel(),
        f"{prefix}attn.v": ColwiseParallel(),
        f"{prefix}attn.out": RowwiseParallel(output_layouts=out),
    }
    plan |= mlp_plan(f"{prefix}mlp.", sequence_parallel)
    if sequence_parallel:
        plan |= sequence_parallel_plan(prefix)
    return plan


def parallelize_block(
    block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool = False
) -> nn.Module:
    """Split ``block`` (in place) over ``mesh``; each rank then computes heads/n
    heads, so the attention's head count becomes the local one (15)."""
    parallelize_module(block, mesh, block_plan("", sequence_parallel))
    block.attn.heads //= mesh.size()
    return block


def parallelize_lm(lm: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split a :class:`~multigpu.tensor_parallel.model.TinyLM` (in place): the
    embedding by vocabulary rows (``RowwiseParallel`` on an ``nn.Embedding``), the
    block as :func:`parallelize_block`, the head by vocabulary with its logits left
    as a DTensor sharded on the last dimension, for ``loss_parallel`` (15)."""
    plan = block_plan("block.") | {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(lm, mesh, plan)
    lm.block.attn.heads //= mesh.size()
    return lm


def parallelize_2d(block: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel on the mesh's "tp" dimension, then FSDP2's ``fully_shard`` on
    its "dp" dimension (each TP shard sharded again over the data-parallel ranks):
    2-D parallelism on a (dp, tp) mesh (15)."""
    parallelize_block(block, mesh["tp"])
    fully_shard(block, mesh=mesh["dp"])
    return block
