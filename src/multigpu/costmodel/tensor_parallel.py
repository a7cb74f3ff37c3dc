"""What tensor and sequence parallelism send and keep, per transformer layer (15).

Taught in ``notebooks/15_tensor_and_sequence_parallel.ipynb`` next to the bytes that
:mod:`multigpu.tensor_parallel` really sends; notebook 16's decision guide uses the
two traffic formulas. A transformer layer (attention + MLP) split Megatron's way
over ``tp`` ranks moves activations of S = batch·seq·hidden values:

- tensor parallel (TP): one all-reduce of S per block in forward (after the
  row-parallel linear) and one in backward (before the column-parallel linear):
  4 all-reduces per layer per step; a ring all-reduce sends 2(tp-1)/tp·S per rank;
- sequence parallel (SP): each all-reduce becomes a reduce-scatter plus an
  all-gather, each (tp-1)/tp·S: the same bytes, but the LayerNorm and dropout
  regions keep only seq/tp of the sequence.

Activations per rank (:func:`tp_activation_bytes`) count what the hand-built block
of :mod:`multigpu.tensor_parallel` saves for backward, by region.
"""

from __future__ import annotations

ALL_REDUCES_PER_LAYER = 4  # attention and MLP, forward and backward


def _check(tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(
            f"tp must be a positive whole number of ranks, got {tp!r}. Pass the "
            "tensor-parallel world size (1 means no tensor parallelism)."
        )


def tp_all_reduce_bytes_per_layer(
    batch: int, seq: int, hidden: int, tp: int, bytes_per_value: int
) -> float:
    """Bytes each rank sends per transformer layer (attention + MLP) per training
    step, forward + backward, under tensor parallelism with ring all-reduces:
    4 all-reduces of batch·seq·hidden values, each 2(tp-1)/tp of the message (15)."""
    _check(tp)
    message = batch * seq * hidden * bytes_per_value
    return ALL_REDUCES_PER_LAYER * 2 * (tp - 1) / tp * message


def sp_bytes_per_layer(
    batch: int, seq: int, hidden: int, tp: int, bytes_per_value: int
) -> float:
    """Bytes each rank sends per transformer layer per training step under sequence
    parallelism: 4 reduce-scatters and 4 all-gathers of batch·seq·hidden values,
    each (tp-1)/tp of the full message; equal to :func:`tp_all_reduce_bytes_per_layer`
    (15)."""
    _check(tp)
    message = batch * seq * hidden * bytes_per_value
    return 2 * ALL_REDUCES_PER_LAYER * (tp - 1) / tp * message


def tp_activation_bytes(
    batch: int,
    seq: int,
    hidden: int,
    ffn: int,
    heads: int,
    tp: int,
    sequence_parallel: bool,
    bytes_per_value: int,
) -> dict[str, float]:
    """Bytes each rank saves for backward in one hand-built transformer layer of
    :mod:`multigpu.tensor_parallel` without dropout, by region (15).

    With T = batch·seq tokens:

    - ``sequence``: the LayerNorms' inputs and their mean and rstd, 2·(T·h + 2T)
      values: on every rank under TP, 1/tp of it under SP;
    - ``gathered``: the whole LayerNorm outputs that the column-parallel linears
      keep for their weight gradients, 2·T·h: whole under both (Megatron's SP keeps
      only the local chunk and all-gathers it again in backward; this one does not);
    - ``split``: q, k, v and the context (4·T·h/tp), the attention probabilities
      (batch·heads·seq²/tp), the MLP's hidden layer before and after GELU
      (2·T·ffn/tp);
    - ``mask``: the causal mask, seq² booleans of one byte.
    """
    _check(tp)
    tokens = batch * seq
    sequence = 2 * (tokens * hidden + 2 * tokens) * bytes_per_value
    split = tokens * (4 * hidden + 2 * ffn) + batch * heads * seq * seq
    return {
        "sequence": sequence / tp if sequence_parallel else float(sequence),
        "gathered": float(2 * tokens * hidden * bytes_per_value),
        "split": split * bytes_per_value / tp,
        "mask": float(seq * seq),
    }
