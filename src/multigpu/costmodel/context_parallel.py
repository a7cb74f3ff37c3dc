"""What context parallelism sends, computes and keeps, per rank (17).

Taught in ``notebooks/17_context_parallel.ipynb`` next to what
:mod:`multigpu.context_parallel` really sends, computes and saves. A sequence of S
tokens over n ranks; b sequences, H heads of d values, B bytes per value; rank r
holds t_r tokens (S/n when n divides S).

- Ring attention sends its key/value block on n − 1 times in forward; in backward
  the blocks go around again with their gradients, which need one more step home:
  forward 2(S − t_{r+1})·b·H·d·B, backward that plus 2S·b·H·d·B.
- Ulysses runs four all-to-alls per forward (q, k, v to split heads, the output
  back) and four in backward; a rank keeps 1/n of what it holds and sends the
  rest: with t = S/n, 4(n − 1)/n · t·b·H·d·B each way, n/2 times less than the
  ring's forward 2(n − 1)·t·b·H·d·B; in backward the ring sends (4n − 2)·t·b·H·d·B.
- Under a causal mask, contiguous rank r computes r + 1 of its n blocks; zig-zag
  gives every rank 2n + 1 of 4n half-size blocks (:func:`causal_block_counts`).
  A rank *needs* the query-key pairs the mask lets through (p + 1 for a query at
  position p) and *computes* more: a block on the diagonal whole, then masked.
- Activations: ring attention keeps 4·b·H·t·d + b·H·t values per rank (q, k, v,
  output, log-sum-exp), plain attention on the whole sequence (one process, or
  Ulysses' H/n heads) q, k, v and the S² probabilities, 3·b·H·S·d + b·H·S². The
  lesson's attention block keeps 6·b·t·hidden + b·H·t values per rank with ring
  attention, against 5·b·S·hidden + b·H·S² (and the S² mask bytes)
  for plain attention in one process. For a transformer layer in 16-bit with
  flash attention, 34·s·b·h bytes (Korthikanti et al. 2022, arXiv:2205.05198,
  eq. 1 without the 5as/h term that flash attention does not store), divided by
  the context- and tensor-parallel sizes.
"""

from __future__ import annotations

from multigpu.core.checks import check_choice, check_positive_int

__all__ = [
    "FLASH_LAYER_FACTOR",
    "attention_activation_bytes",
    "block_activation_bytes",
    "causal_block_counts",
    "causal_scores_needed",
    "causal_scores_per_rank",
    "logits_bytes",
    "longest_sequence",
    "ring_attention_bytes",
    "tokens_per_rank",
    "transformer_activation_bytes",
    "ulysses_bytes",
]

FLASH_LAYER_FACTOR = 34  # bytes per token per hidden unit in a 16-bit layer


def tokens_per_rank(seq_len: int, world_size: int, layout: str = "contiguous"):
    """Tokens each rank holds: contiguous as ``tensor_split`` cuts, zig-zag S/n
    (17)."""
    check_choice("layout", layout, ("contiguous", "zigzag"))
    n = check_positive_int("world_size", world_size)
    base, extra = divmod(seq_len, n)
    return [base + (r < extra) for r in range(n)]


def ring_attention_bytes(
    seq_len: int,
    world_size: int,
    rank: int,
    batch: int,
    heads: int,
    head_dim: int,
    bytes_per_value: int,
    layout: str = "contiguous",
) -> dict[str, int]:
    """Bytes ``rank`` sends in one ring attention: {"forward", "backward"} (17)."""
    n = check_positive_int("world_size", world_size)
    if n == 1:
        return {"forward": 0, "backward": 0}
    tokens = tokens_per_rank(seq_len, n, layout)
    block = batch * heads * head_dim * bytes_per_value  # one token's k or v
    forward = 2 * (seq_len - tokens[(rank + 1) % n]) * block
    return {"forward": forward, "backward": forward + 2 * seq_len * block}


def ulysses_bytes(
    seq_len: int,
    world_size: int,
    rank: int,
    batch: int,
    heads: int,
    head_dim: int,
    bytes_per_value: int,
) -> dict[str, int]:
    """Bytes ``rank`` sends to other ranks in Ulysses' all-to-alls: {"forward",
    "backward"} (17)."""
    n = check_positive_int("world_size", world_size)
    mine = tokens_per_rank(seq_len, n)[rank]
    per_token_head = batch * head_dim * bytes_per_value
    scatter_heads = mine * (heads - heads // n) * per_token_head  # q, k, v out
    gather_heads = (seq_len - mine) * (heads // n) * per_token_head  # output back
    return {
        "forward": 3 * scatter_heads + gather_heads,
        "backward": scatter_heads + 3 * gather_heads,
    }


def causal_block_counts(layout: str, world_size: int) -> list[dict[str, int]]:
    """Per rank, the blocks ring attention computes whole ("full"), with a mask
    ("causal") and skips under a causal mask, with every rank holding tokens
    (17)."""
    n = check_positive_int("world_size", world_size)
    check_choice("layout", layout, ("contiguous", "zigzag"))
    if layout == "contiguous":
        return [{"full": r, "causal": 1, "skip": n - 1 - r} for r in range(n)]
    return [{"full": 2 * n - 1, "causal": 2, "skip": 2 * n - 1} for _ in range(n)]


def causal_scores_per_rank(layout: str, seq_len: int, world_size: int) -> list[int]:
    """Query-key products each rank computes under a causal mask, blocks on the
    diagonal computed whole (17)."""
    tokens = tokens_per_rank(seq_len, world_size, layout)
    if layout == "contiguous":
        starts = [sum(tokens[:r]) for r in range(world_size)]
        return [t * (start + t) for t, start in zip(tokens, starts)]
    chunk = seq_len // (2 * world_size)
    return [(2 * world_size + 1) * chunk * chunk for _ in range(world_size)]


def causal_scores_needed(layout: str, seq_len: int, world_size: int) -> list[int]:
    """Query-key products each rank needs under a causal mask: p + 1 for each
    query at position p it holds (17)."""
    tokens = tokens_per_rank(seq_len, world_size, layout)
    if layout == "contiguous":
        starts = [sum(tokens[:r]) for r in range(world_size)]
        return [t * start + t * (t + 1) // 2 for t, start in zip(tokens, starts)]
    chunk = seq_len // (2 * world_size)
    return [2 * world_size * chunk * chunk + chunk for _ in range(world_size)]


def attention_activation_bytes(
    seq_len: int,
    world_size: int,
    rank: int,
    batch: int,
    heads: int,
    head_dim: int,
    bytes_per_value: int,
    scheme: str = "ring",
    causal: bool = False,
    layout: str = "contiguous",
) -> int:
    """Bytes autograd keeps on ``rank`` from attention's forward to its backward:
    ring attention keeps its q, k, v, output and log-sum-exp, 4·b·H·t·d + b·H·t
    values for its t tokens; "ulysses" (plain attention on the whole sequence for
    H/n heads; n = 1 is one process) keeps q, k, v of those heads and their S x S
    probabilities, 3·b·(H/n)·S·d + b·(H/n)·S² values, and, causal, the S² mask
    bytes (17)."""
    check_choice("scheme", scheme, ("ring", "ulysses"))
    if scheme == "ring":
        tokens = tokens_per_rank(seq_len, world_size, layout)[rank]
        values = 4 * batch * heads * tokens * head_dim + batch * heads * tokens
        return values * bytes_per_value
    group = heads // world_size
    values = 3 * batch * group * seq_len * head_dim + batch * group * seq_len**2
    return values * bytes_per_value + (seq_len**2 if causal else 0)


def block_activation_bytes(
    tokens: int,
    batch: int,
    hidden: int,
    heads: int,
    bytes_per_value: int,
    ring: bool = True,
    causal: bool = False,
) -> int:
    """Bytes autograd keeps for the lesson's attention block on ``tokens`` tokens:
    with ring attention 6·b·t·hidden + b·H·t values (input, q, k, v, output,
    context; log-sum-exp; with one token the context is a view of the output, not
    a copy); in one process with plain attention 5·b·t·hidden + b·H·t² values
    and, causal, t² mask bytes (17)."""
    if ring:
        copies = 6 if tokens > 1 else 5
        values = copies * batch * tokens * hidden + batch * heads * tokens
        return values * bytes_per_value
    values = 5 * batch * tokens * hidden + batch * heads * tokens * tokens
    return values * bytes_per_value + (tokens * tokens if causal else 0)


def transformer_activation_bytes(
    seq_len: int,
    batch: int,
    hidden: int,
    layers: int,
    cp: int = 1,
    tp: int = 1,
    recompute: bool = False,
) -> float:
    """Activation bytes per GPU of a transformer in 16-bit with flash attention:
    34·s·b·h per layer (Korthikanti et al. 2022, eq. 1 without its 5as/h term),
    each rank holding s/cp tokens, tensor and sequence parallel over tp; with
    ``recompute`` (full activation checkpointing), 2·s·b·h per layer plus one
    layer's 34·s·b·h while it is recomputed (17)."""
    check_positive_int("cp", cp)
    check_positive_int("tp", tp)
    token_units = seq_len * batch * hidden / (cp * tp)
    layer = FLASH_LAYER_FACTOR * token_units
    if recompute:
        return layers * 2 * token_units + layer
    return layers * layer


def logits_bytes(
    seq_len: int, vocab: int, batch: int = 1, cp: int = 1, bytes_per_value: int = 2
) -> float:
    """Bytes of the logits (batch, seq_len / cp, vocab) on each of ``cp`` ranks,
    16-bit by default: what :func:`longest_sequence` leaves out (17)."""
    check_positive_int("cp", cp)
    return seq_len / cp * batch * vocab * bytes_per_value


def longest_sequence(
    memory_bytes: float,
    state_bytes: float,
    hidden: int,
    layers: int,
    batch: int = 1,
    cp: int = 1,
    tp: int = 1,
    recompute: bool = False,
) -> int:
    """The longest sequence whose layers' activations
    (:func:`transformer_activation_bytes`) fit in what ``memory_bytes`` leaves after
    ``state_bytes``: an upper bound, without the logits (:func:`logits_bytes`) and
    the communication buffers (17)."""
    free = memory_bytes - state_bytes
    if free <= 0:
        return 0
    per_token = transformer_activation_bytes(
        1, batch, hidden, layers, cp, tp, recompute
    )
    return int(free // per_token)
