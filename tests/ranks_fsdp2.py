"""Test-only rank functions for tests/fsdp2: PyTorch's own CommDebugMode counting
the collectives of one FSDP2 step, beside multigpu.fsdp2.CollectiveLog."""

from torch import nn

from multigpu.fsdp2 import CollectiveLog, rank_part, shard_layers


def comm_debug_rank(rank, world_size, model, batch):
    """One forward and backward of an FSDP2 copy of ``model``, counted by
    CommDebugMode ({op name: count}) and by CollectiveLog ({kind: count})."""
    from torch.distributed.tensor.debug import CommDebugMode

    sharded = shard_layers(model, reshard_after_forward=True)
    inputs, labels = rank_part(batch, rank, world_size)
    with CommDebugMode() as debug, CollectiveLog(sharded) as log:
        nn.functional.cross_entropy(sharded(inputs), labels).backward()
    torch_counts = {str(op): count for op, count in debug.get_comm_counts().items()}
    ours = {kind: log.count(kind) for kind in ("all-gather", "reduce-scatter")}
    return torch_counts, ours
