"""What expert parallelism sends, as formulas of plain numbers (18).

Per step and MoE layer a rank sends the others: its counts per expert (E/ep
integers to each other rank), its rows for their experts (dispatch), the outputs
of the rows it received (combine), and in backward the same two the other way
(the combine's backward sends the gradients of the rows it got back, the
dispatch's backward the gradients of the rows it received). So with s rows sent
to and r rows received from the other ranks, of dim values of b bytes:
2·dim·b·(s + r) bytes, plus the counts. Routing spread evenly, nothing dropped,
s = r = n·k·(ep − 1)/ep for n tokens per rank and top-k routing.

The alternative is to replicate the experts and all-reduce their gradients (data
parallelism): 2(w − 1)/w · E·P·b bytes per rank for E experts of P parameters,
whatever the number of tokens. EP sends less when a rank's tokens per step are
fewer than E·P / (2·k·dim) (:func:`break_even_tokens`).
"""

from __future__ import annotations

import math

from multigpu.core.checks import check_positive_int

__all__ = [
    "COUNT_BYTES",
    "all_to_all_bytes",
    "balanced_all_to_all_bytes",
    "break_even_tokens",
    "capped_all_to_all_bytes",
    "replicated_experts_bytes",
]

COUNT_BYTES = 8  # a count per expert is an int64


def _counts_bytes(num_experts: int, ep_size: int) -> int:
    return (ep_size - 1) * (num_experts // ep_size) * COUNT_BYTES


def all_to_all_bytes(
    rows_sent: int,
    rows_received: int,
    dim: int,
    bytes_per_value: int,
    num_experts: int,
    ep_size: int,
) -> int:
    """Bytes one rank sends the other ranks in one step (forward and backward) of
    one MoE layer, ``rows_sent`` to and ``rows_received`` from the others:
    2·dim·b·(sent + received) + the counts, (ep − 1)·(E/ep)·8 (18)."""
    rows = 2 * (rows_sent + rows_received)
    return rows * dim * bytes_per_value + _counts_bytes(num_experts, ep_size)


def balanced_all_to_all_bytes(
    tokens_per_rank: int,
    top_k: int,
    dim: int,
    bytes_per_value: int,
    num_experts: int,
    ep_size: int,
) -> float:
    """:func:`all_to_all_bytes` when every expert gets the same share of every
    rank's tokens and none is dropped: 4·n·k·(ep − 1)/ep·dim·b + the counts (18)."""
    check_positive_int("ep_size", ep_size)
    crossing = tokens_per_rank * top_k * (ep_size - 1) / ep_size  # s = r
    rows = 4 * crossing
    return rows * dim * bytes_per_value + _counts_bytes(num_experts, ep_size)


def capped_all_to_all_bytes(
    tokens_per_rank: int,
    top_k: int,
    dim: int,
    bytes_per_value: int,
    num_experts: int,
    ep_size: int,
    capacity_factor: float,
) -> int:
    """The most any routing makes one rank send when every rank has at most n tokens
    and each expert takes at most C = ceil(n·k/E·cf) of each rank's: it sends at most
    min(n·k, (E − E/ep)·C) rows and receives at most (ep − 1)·(E/ep)·C (18)."""
    local = num_experts // ep_size
    capacity = math.ceil(tokens_per_rank * top_k / num_experts * capacity_factor)
    sent = min(tokens_per_rank * top_k, (num_experts - local) * capacity)
    received = (ep_size - 1) * local * capacity
    return all_to_all_bytes(sent, received, dim, bytes_per_value, num_experts, ep_size)


def replicated_experts_bytes(
    num_experts: int, expert_parameters: int, world_size: int, bytes_per_value: int
) -> float:
    """Bytes one rank sends per step when every rank holds every expert and
    ring-all-reduces their gradients: 2(w − 1)/w · E·P·b (18)."""
    check_positive_int("world_size", world_size)
    share = 2 * (world_size - 1) / world_size
    return share * num_experts * expert_parameters * bytes_per_value


def break_even_tokens(
    num_experts: int, expert_parameters: int, top_k: int, dim: int
) -> float:
    """Tokens per rank and step below which EP's all-to-alls send fewer bytes than
    all-reducing replicated experts' gradients: E·P / (2·k·dim), the same for every
    world size (the (w − 1)/w of both cancel; counts left out) (18)."""
    return num_experts * expert_parameters / (2 * top_k * dim)
