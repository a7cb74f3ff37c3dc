"""Rank functions of the tests of multigpu.ddp that tests/ranks/ does not hold."""

from __future__ import annotations

from multigpu import ddp


def agreement_rank(rank, world_size, parameters, odd_ranks):
    """``ddp.check_same_weights`` on ``parameters``, whose second tensor is changed
    on the ranks in ``odd_ranks``: the error's text, or None if it passed."""
    mine = {name: tensor.clone() for name, tensor in parameters.items()}
    if rank in odd_ranks:
        mine[list(mine)[1]] += 1
    try:
        ddp.check_same_weights(mine)
    except ddp.WeightsDifferError as error:
        return str(error)
    return None
