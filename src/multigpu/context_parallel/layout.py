"""Which tokens of the sequence each rank holds: contiguous or zig-zag (17).

A layout cuts a sequence of ``seq_len`` tokens into *chunks*, runs of consecutive
positions, and gives each rank its chunks:

- ``"contiguous"``: one chunk per rank, cut as ``tensor_split`` cuts (the first
  ``seq_len % world_size`` ranks get one token more; a rank may get none);
- ``"zigzag"``: the sequence in 2·n equal chunks, rank r taking chunk r and chunk
  2n − 1 − r (head and tail), so that under a causal mask every rank has the same
  work. It needs ``seq_len`` divisible by 2·n and refuses anything else by name.

A rank's local tensor is its chunks concatenated in order (:func:`shard_sequence`);
:func:`unshard_sequence` puts every rank's piece back in sequence order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multigpu.core.checks import check_choice, check_positive_int

__all__ = [
    "LAYOUTS",
    "check_layout",
    "chunks_of",
    "layout_chunks",
    "layout_positions",
    "shard_sequence",
    "unshard_sequence",
]

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: str, seq_len: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``layout`` can cut ``seq_len`` tokens over
    ``world_size`` ranks (17)."""
    check_choice("layout", layout, LAYOUTS)
    check_positive_int("world_size", world_size)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(
            f"seq_len must be a whole number of tokens, got {seq_len!r}. Pass an int."
        )
    if layout == "zigzag" and seq_len % (2 * world_size):
        fits = -(-seq_len // (2 * world_size)) * 2 * world_size
        raise ValueError(
            f"zig-zag sharding needs the sequence length ({seq_len}) to be divisible "
            f"by 2 x world size ({2 * world_size}): each rank takes two equal chunks. "
            f"Pad the sequence to {fits} tokens, or use the contiguous layout."
        )


def layout_chunks(layout: str, seq_len: int, world_size: int, rank: int) -> list[range]:
    """The chunks of positions ``rank`` holds, in its local order: one range for
    "contiguous", two (head, tail) for "zigzag"; a range may be empty (17)."""
    check_layout(layout, seq_len, world_size)
    if layout == "contiguous":
        base, extra = divmod(seq_len, world_size)
        start = rank * base + min(rank, extra)
        return [range(start, start + base + (rank < extra))]
    size = seq_len // (2 * world_size)
    tail = 2 * world_size - 1 - rank
    return [
        range(rank * size, (rank + 1) * size),
        range(tail * size, (tail + 1) * size),
    ]


def layout_positions(
    layout: str, seq_len: int, world_size: int, rank: int
) -> torch.Tensor:
    """The positions ``rank`` holds, in its local order: (tokens,) int64 (17)."""
    chunks = layout_chunks(layout, seq_len, world_size, rank)
    return torch.tensor([p for chunk in chunks for p in chunk], dtype=torch.long)


def shard_sequence(
    x: torch.Tensor, layout: str, world_size: int, rank: int, dim: int = 2
) -> torch.Tensor:
    """``rank``'s tokens of ``x`` along ``dim`` (2 for (batch, heads, seq, d)),
    in its local order (17)."""
    positions = layout_positions(layout, x.shape[dim], world_size, rank)
    return x.index_select(dim, positions)


def unshard_sequence(
    pieces: Sequence[torch.Tensor], layout: str, seq_len: int, dim: int = 2
) -> torch.Tensor:
    """Every rank's piece (rank order) put back in sequence order along ``dim``:
    the inverse of :func:`shard_sequence` (17)."""
    world_size = len(pieces)
    positions = torch.cat(
        [layout_positions(layout, seq_len, world_size, r) for r in range(world_size)]
    )
    joined = torch.cat(list(pieces), dim=dim)
    order = torch.argsort(positions)
    return joined.index_select(dim, order)


def chunks_of(positions: Sequence[int]) -> list[range]:
    """``positions`` (in a rank's local order) as runs of consecutive positions:
    [0, 1, 14, 15] -> [range(0, 2), range(14, 16)] (17)."""
    chunks: list[range] = []
    for position in positions:
        if chunks and chunks[-1].stop == position:
            chunks[-1] = range(chunks[-1].start, position + 1)
        else:
            chunks.append(range(position, position + 1))
    return chunks
