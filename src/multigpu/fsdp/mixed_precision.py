"""Mixed precision around the collectives: cast before sending, reduce in fp32 (14).

A rank keeps its master weights (the shard) in float32. Before a unit's forward its
parameters are all-gathered in the compute dtype, bfloat16: each rank casts its own
chunk first (:func:`gather_parameters`), so every number travels as 2 bytes, not 4.
Backward computes the unit's gradient in bfloat16; it is cast to float32 before the
reduce-scatter (:func:`reduce_gradient`), so the sum over the ranks is rounded once,
at the end, not at every addition of the ring. This is FSDP2's
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``
(``torch/distributed/fsdp/_fully_shard/``): ``FSDPParam.all_gather_inputs`` in
``_fsdp_param.py`` casts the local shard to ``param_dtype``; ``foreach_reduce`` in
``_fsdp_collectives.py`` copies the gradients into a ``reduce_dtype`` buffer and
casts the reduced chunk back to the parameter's dtype. With no compute dtype both
are plain float32 (or float64) collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from multigpu.collectives import all_gather, reduce_scatter


def gather_parameters(shard: torch.Tensor, full: torch.Tensor) -> int:
    """All-gather every rank's ``shard`` (master dtype) into ``full`` (the whole
    unit, compute dtype): cast this rank's chunk to ``full.dtype`` first, so the
    ring carries compute-dtype bytes; return the bytes sent (14)."""
    return all_gather(full, shard.detach().to(full.dtype))


def reduce_gradient(full_grad: torch.Tensor, shard_grad: torch.Tensor) -> int:
    """Reduce-scatter the unit's gradient ``full_grad`` (compute dtype) into this
    rank's ``shard_grad`` (master dtype), summed in the master dtype, and divide by
    the world size: the mean gradient of this rank's chunk; return the bytes sent
    (14)."""
    sent = reduce_scatter(shard_grad, full_grad.to(shard_grad.dtype))
    shard_grad /= dist.get_world_size()
    return sent
