"""What an all-reduce costs: bytes per rank, the α-β time model, bus bandwidth (07).

For a tensor of S bytes all-reduced on n ranks:

- Bytes sent per rank. Naive (through rank 0): (n-1)·S on rank 0, S on every other
  rank. Ring: 2(n-1)/n·S on every rank, exact when n divides the element count; the
  ring sends every chunk twice, except the one it keeps in the reduce-scatter and
  the one it does not pass on in the all-gather, so uneven chunks give each rank a
  slightly different count (:func:`ring_bytes_per_rank`).
- Time, α-β model: a message of m bytes costs α + m/B (α the latency of one message,
  B the bandwidth of one link), counted on the busiest link.
  Ring: 2(n-1) steps of S/n bytes, t ≈ 2(n-1)·α + 2(n-1)/n·S/B.
  Naive: rank 0 handles 2(n-1) whole tensors one after another,
  t ≈ 2(n-1)·(α + S/B).
  Tree: a binomial-tree reduce to rank 0, then a binomial-tree broadcast from it,
  each ⌈log2 n⌉ rounds in which a rank sends or receives at most one whole tensor:
  t ≈ 2⌈log2 n⌉·(α + S/B). From 4 ranks on that is fewer steps than the ring
  (latency 2·log2(n)·α instead of 2(n-1)·α), but every step carries S instead of
  S/n: the tree wins on small tensors, the ring on large ones. (NCCL's trees
  also cut the tensor into pieces that stream through the tree one after another,
  so that a large tensor no longer pays ⌈log2 n⌉ times S/B; this unpipelined tree
  is the simplest one.)
- Bandwidth, as nccl-tests report it
  (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
  algbw = S/t; for all-reduce busbw = algbw·2(n-1)/n, the number to compare with a
  link's bandwidth and across world sizes.
"""

from __future__ import annotations

from multigpu.collectives import ring_chunk_sizes


def naive_bytes_per_rank(nbytes: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends in ``collectives.naive_all_reduce`` of an ``nbytes``
    tensor: (n-1)·S on rank 0, S elsewhere (07)."""
    if world_size == 1 or nbytes == 0:
        return 0
    return (world_size - 1) * nbytes if rank == 0 else nbytes


def ring_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.ring_all_reduce``: every chunk
    twice, except chunk r+1 (kept in the reduce-scatter) and r+2 (not sent on) (07)."""
    if world_size == 1:
        return 0
    sizes = ring_chunk_sizes(numel, world_size)
    skipped = sizes[(rank + 1) % world_size] + sizes[(rank + 2) % world_size]
    return (2 * numel - skipped) * element_size


def ring_bytes_theory(nbytes: float, world_size: int) -> float:
    """2(n-1)/n · S: what each rank sends in a ring all-reduce (exact when n
    divides the element count) (07)."""
    return 2 * (world_size - 1) / world_size * nbytes


def reduce_scatter_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.reduce_scatter`` of ``numel``
    elements: every chunk once except its own, (n-1)/n·S when n divides ``numel``
    (13)."""
    sizes = ring_chunk_sizes(numel, world_size)
    return (numel - sizes[rank]) * element_size


def all_gather_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.all_gather`` into ``numel``
    elements: every chunk once except the one of its right neighbour, the last to
    arrive (13)."""
    sizes = ring_chunk_sizes(numel, world_size)
    return (numel - sizes[(rank + 1) % world_size]) * element_size


def tree_steps(world_size: int) -> int:
    """Messages on the critical path of a binomial-tree reduce then broadcast:
    2⌈log2 n⌉ (07)."""
    return 2 * (world_size - 1).bit_length()  # (n-1).bit_length() = ⌈log2 n⌉


def alpha_beta_time(
    algorithm: str, nbytes: float, world_size: int, alpha: float, bandwidth: float
) -> float:
    """Seconds the α-β model predicts for a "ring", "naive" or "tree" all-reduce of
    ``nbytes`` with ``alpha`` seconds per message and ``bandwidth`` bytes/s per link;
    the formulas and the tree are in the module's docstring (07, 12)."""
    steps = 2 * (world_size - 1)
    if algorithm == "ring":
        return steps * alpha + ring_bytes_theory(nbytes, world_size) / bandwidth
    if algorithm == "naive":
        return steps * (alpha + nbytes / bandwidth)
    if algorithm == "tree":
        return tree_steps(world_size) * (alpha + nbytes / bandwidth)
    raise ValueError(f"Unknown algorithm {algorithm!r}. Use 'ring', 'naive' or 'tree'.")


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """nccl-tests' algbw: tensor bytes over time, bytes/s (07)."""
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' busbw for all-reduce: algbw · 2(n-1)/n, comparable across world
    sizes and with link bandwidth, bytes/s (07)."""
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size
