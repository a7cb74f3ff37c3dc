"""Test-only rank functions of the tests of multigpu.fsdp (14)."""

import torch

from multigpu.fsdp import FSDPByHand
from multigpu.zero import make_mlp


def no_wait_prefetch(wrapper, order, position):
    """A prefetch that forgets to wait for the unit that computes now."""
    wrapper.issue_gather(order[position])


def refused_messages_rank(rank, world_size):
    """The errors FSDPByHand raises for a forgotten wait and a negative depth."""
    torch.set_num_threads(1)
    messages = []
    model = make_mlp((4, 3, 2), dtype=torch.float32)
    fsdp = FSDPByHand(model, prefetch=no_wait_prefetch)
    try:
        fsdp(torch.ones(2, 4))
    except RuntimeError as error:
        messages.append(str(error))
    fsdp.stream.close()
    try:
        FSDPByHand(make_mlp((4, 3, 2), dtype=torch.float32), depth=-1)
    except ValueError as error:
        messages.append(str(error))
    return messages
