"""Rank functions of the tests of multigpu.fsdp that tests/ranks_fsdp.py does not
hold: which gradients stay None under FSDP by hand and under FSDP2."""

import copy

import torch
from torch.nn import functional as F

from multigpu.fsdp import FSDPByHand

WEIGHT_DECAY = 0.1  # moves a parameter whose gradient is zero, not one with None
STEPS = 3


def unread_parameter_rank(rank, world_size, model, X, y, lr):
    """``model`` (the same on every rank) trained on this rank's share of ``X`` (rows
    ``rank::world_size``) by FSDPByHand with Adam and weight decay, and one backward
    under FSDP2 (``fully_shard`` on each child, then the model). Returns ({name:
    grad is None} of FSDPByHand's pieces after the first backward, the full weights
    after ``STEPS`` steps, FSDP2's {name: grad is None} after its backward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    X, y = X[rank::world_size], y[rank::world_size]
    fsdp = FSDPByHand(copy.deepcopy(model))
    try:
        optimizer = torch.optim.Adam(fsdp.shards, lr=lr, weight_decay=WEIGHT_DECAY)
        by_hand = None
        for _ in range(STEPS):
            optimizer.zero_grad()
            F.cross_entropy(fsdp(X), y).backward()
            if by_hand is None:
                by_hand = {
                    name: piece.grad is None
                    for unit in fsdp.units
                    for name, _, piece in unit.pieces.values()
                }
            optimizer.step()
        weights = fsdp.full_state_dict()
    finally:
        fsdp.stream.close()
    fsdp2 = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (world_size,))
    for child in fsdp2.children():
        fully_shard(child, mesh=mesh)
    fully_shard(fsdp2, mesh=mesh)
    F.cross_entropy(fsdp2(X), y).backward()
    theirs = {name: p.grad is None for name, p in fsdp2.named_parameters()}
    return by_hand, weights, theirs
