"""PyTorch's own context parallelism on CPU ranks: what runs, and what fails (17).

``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=...,
buffer_seq_dims=...)`` does two things (torch/distributed/tensor/experimental/
_context_parallel/_attention.py): it shards the buffers along the sequence, in
head-tail (zig-zag) order when the length divides by 2·n
(``_HeadTailLoadBalancer`` in ``_load_balancer.py``), and it replaces
``F.scaled_dot_product_attention`` with a version that turns q, k, v into DTensors
sharded on the sequence. SDPA then dispatches to a kernel: on GPUs the flash,
memory-efficient or cuDNN ones, which context parallelism replaces with ring
attention (``_templated_ring_attention``); on CPU the CPU flash kernel, for which
DTensor has no sharding strategy, so it fails. With SDPA's math backend the
attention is decomposed into matmul and softmax on DTensors, which DTensor
computes by gathering the sharded keys and values whole.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn import functional as F

from multigpu.context_parallel.step import AttentionCase

__all__ = ["torch_context_parallel_attention", "torch_head_tail_positions"]


def torch_head_tail_positions(seq_len: int, world_size: int) -> list[list[int]]:
    """The positions each rank holds under PyTorch's default load balancer, or
    contiguous positions when it has none for this length (17)."""
    from torch.distributed.tensor.experimental._context_parallel import (
        _load_balancer,
    )

    balancer = _load_balancer._create_default_load_balancer(seq_len, world_size, "cpu")
    order = torch.arange(seq_len) if balancer is None else balancer._generate_indices()
    return [chunk.tolist() for chunk in order.reshape(-1).chunk(world_size)]


def torch_context_parallel_attention(case: AttentionCase, backend: str) -> dict:
    """This rank's (in a process group) run of ``context_parallel`` on ``case``
    (q, k, v of the whole sequence), with SDPA's ``backend``: "default" (on CPU:
    raises) or "math"; {"out": the unsharded output, "collectives": {name:
    count}, "positions": the positions this rank held} (17)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import (
        context_parallel,
        implicit_replication,
    )
    from torch.distributed.tensor.experimental._attention import (
        context_parallel_unshard,
    )
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    q, k, v = (t.clone() for t in (case.q, case.k, case.v))
    positions = torch_head_tail_positions(case.q.shape[2], world_size)[rank]
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        kernel = (
            sdpa_kernel(SDPBackend.MATH)
            if backend == "math"
            else contextlib.nullcontext()
        )
        # a causal mask is a plain tensor: it needs implicit_replication to mix
        replicate = implicit_replication() if case.causal else contextlib.nullcontext()
        with kernel, replicate, CommDebugMode() as comm:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        full = context_parallel_unshard(mesh, [out], [2])[0]
    counts = {str(name): n for name, n in comm.get_comm_counts().items()}
    return {"out": full, "collectives": counts, "positions": positions}
