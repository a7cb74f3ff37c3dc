"""Formulas for a Llama-shaped model under FSDP2 x TP, and a 4-D step's cost (20).

Taught in ``notebooks/20_plan_a_cluster_job.ipynb`` next to what PyTorch's memory
tracker and ``CommDebugMode`` count on a fake mesh (:mod:`multigpu.cluster`).

- Collectives per step (:func:`fsdp_tp_collectives_per_step`): FSDP2's all-gathers
  and reduce-scatters (14b's ``fsdp2_collectives_per_step``, the blocks and the
  root as units, the root kept after forward); DTensor's
  tensor parallelism all-reduces each row-parallel output in forward and the input
  gradient of *each* column-parallel linear in backward: 2 + 5 per block for
  q, k, v, gate and up, where Megatron's hand-written version (15) sums the
  gradients first and all-reduces once (2 + 2). Plus the embedding's forward
  all-reduce, the output layer's input-gradient all-reduce and its all-gather of
  the logits.
- Parameter bytes (:func:`llama_state_bytes`): each parameter cut by TP, then
  its rows by FSDP2 with ``ceil`` (14b's :func:`~multigpu.costmodel.fsdp2.shard_numel`).
- Activations (:func:`llama_block_activation_bytes`): the census of what one
  block keeps here (16-bit compute, RMSNorm keeping fp32 copies, no sequence
  parallelism), next to 17's 34·s·b·h rule.
- A 4-D step (:func:`parallel_step_time`): compute at a fraction of peak, the
  1F1B bubble (16), TP's all-reduces on the critical path (16), FSDP's traffic
  hidden behind compute up to the compute time (13, 14b).
"""

from __future__ import annotations

import math

from multigpu.core.checks import check_positive_int
from multigpu.costmodel.communication import alpha_beta_time
from multigpu.costmodel.fsdp2 import fsdp2_collectives_per_step, shard_numel
from multigpu.costmodel.hardware import Link
from multigpu.costmodel.pipeline import bubble_overhead, tp_seconds_per_layer

COLUMN_PARALLEL_PER_BLOCK = 5  # q, k, v, gate, up
ROW_PARALLEL_PER_BLOCK = 2  # o, down


def fsdp_tp_collectives_per_step(
    layers: int,
    dp: int,
    tp: int,
    column_parallel: int = COLUMN_PARALLEL_PER_BLOCK,
    root_parallel: bool = True,
) -> dict[str, int]:
    """Collectives rank 0 issues in one step of a model of ``layers`` blocks under
    FSDP2 over dp (blocks and root as units) and DTensor TP over tp: per block 2
    row-parallel outputs and ``column_parallel`` column-parallel inputs; with
    ``root_parallel`` the embedding and output layer are split too (a Llama) (20)."""
    check_positive_int("layers", layers)
    counts = {}
    if dp > 1:
        fsdp = fsdp2_collectives_per_step(layers + 1, root_keeps_parameters=True)
        counts["all-gather (FSDP)"] = fsdp["all-gather"]
        counts["reduce-scatter (FSDP)"] = fsdp["reduce-scatter"]
    if tp > 1:
        per_block = ROW_PARALLEL_PER_BLOCK + column_parallel
        counts["all-reduce (TP)"] = layers * per_block + 2 * root_parallel
        if root_parallel:
            counts["all-gather (TP)"] = 1
    return dict(sorted(counts.items()))


def megatron_all_reduces_per_step(layers: int) -> int:
    """TP all-reduces of the same step written Megatron's way (15): 4 per block,
    plus the embedding's and the output layer's (20)."""
    return 4 * layers + 2


def llama_parameter_shapes(shape) -> list[tuple[tuple[int, int], int | None, str]]:
    """(full shape, dimension TP cuts or None, unit) of each parameter of a
    :class:`~multigpu.cluster.llama.Llama` of ``shape``; unit "root" or "block" (20)."""
    head = shape.dim // shape.heads
    block = [
        ((shape.dim,), None),  # attention_norm
        ((shape.heads * head, shape.dim), 0),  # wq
        ((shape.kv_heads * head, shape.dim), 0),  # wk
        ((shape.kv_heads * head, shape.dim), 0),  # wv
        ((shape.dim, shape.heads * head), 1),  # wo
        ((shape.dim,), None),  # ffn_norm
        ((shape.ffn_dim, shape.dim), 0),  # w1
        ((shape.ffn_dim, shape.dim), 0),  # w3
        ((shape.dim, shape.ffn_dim), 1),  # w2
    ]
    root = [((shape.vocab, shape.dim), 0), ((shape.dim,), None)]
    root.append(((shape.vocab, shape.dim), 0))  # the untied output layer
    return [(s, d, "root") for s, d in root] + [
        (s, d, "block") for _ in range(shape.layers) for s, d in block
    ]


def _local(full: tuple[int, ...], cut: int | None, tp: int) -> tuple[int, ...]:
    if cut is None or tp == 1:
        return full
    return tuple(math.ceil(n / tp) if i == cut else n for i, n in enumerate(full))


def llama_state_bytes(shape, dp: int, tp: int) -> dict[str, int]:
    """Bytes rank 0 holds for the parameters under FSDP2 x TP with bf16 compute:
    its fp32 shards ("sharded"), the same for gradients, twice for Adam's moments
    plus its step counter (a 4-byte tensor per parameter), and the root's whole
    bf16 parameters kept after forward ("root whole", padded as the all-gather
    makes them) (20)."""
    shards = root = 0
    shapes = llama_parameter_shapes(shape)
    for full, cut, unit in shapes:
        numel = shard_numel(_local(full, cut, tp), dp)
        shards += numel
        if unit == "root":
            root += numel * dp
    return {
        "sharded": 4 * shards,
        "gradients": 4 * shards,
        "optimizer": 8 * shards + 4 * len(shapes),
        "root whole": 2 * root,
    }


def llama_block_activation_bytes(
    shape, tp: int, seq_len: int, batch: int = 1
) -> dict[str, int]:
    """Bytes one block keeps for backward on a TP rank, by part, as counted here
    (bf16 compute): each RMSNorm an fp32 copy of its input and of its normalised
    output, its rstd and its bf16 output whole (no sequence parallelism); q and
    the attention output, k and v (kv_heads), the log-sum-exp (fp32); gate, up,
    silu(gate) and their product (20)."""
    tokens = batch * seq_len
    head = shape.dim // shape.heads
    norm = 4 * tokens * shape.dim * 2 + 4 * tokens + 2 * tokens * shape.dim
    attention = (
        2 * 2 * tokens * shape.heads * head // tp
        + 2 * 2 * tokens * shape.kv_heads * head // tp
        + 4 * batch * shape.heads // tp * seq_len
    )
    mlp = 4 * 2 * tokens * shape.ffn_dim // tp
    return {"norms": 2 * norm, "attention": attention, "mlp": mlp}


def llama_activation_bytes(shape, tp: int, seq_len: int, batch: int = 1) -> int:
    """Activation bytes after forward: every block's
    (:func:`llama_block_activation_bytes`), the final RMSNorm's, the int64 tokens
    and the fp32 loss (20)."""
    tokens = batch * seq_len
    final_norm = 4 * tokens * shape.dim * 2 + 4 * tokens + 2 * tokens * shape.dim
    block = sum(llama_block_activation_bytes(shape, tp, seq_len, batch).values())
    return shape.layers * block + final_norm + 8 * tokens + 4


def parallel_step_time(
    parameters: float,
    layers: int,
    hidden: int,
    seq_len: int,
    global_batch: int,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    flops: float,
    tp_link: Link,
    dp_link: Link,
    recompute: bool = False,
) -> dict[str, float]:
    """Seconds of one step, by part (20): "compute" 6·P·tokens (8 with full
    recomputation) over the GPUs at ``flops`` each; "bubble" its (pp-1)/m share
    with m = global_batch/dp micro-batches of one sequence (16); "tp" the
    all-reduces of every layer on the critical path (16); "dp" FSDP's two
    all-gathers and a reduce-scatter of the rank's parameters over dp·cp ranks,
    minus the compute they hide behind."""
    gpus = dp * tp * pp * cp
    tokens = global_batch * seq_len
    compute = (8 if recompute else 6) * parameters * tokens / (gpus * flops)
    micro_batches = global_batch // dp
    bubble = compute * bubble_overhead(pp, micro_batches) if pp > 1 else 0.0
    per_layer = tp_seconds_per_layer(1, seq_len // cp, hidden, tp, 2, tp_link)
    tp_time = per_layer * layers / pp * micro_batches
    shard_group = dp * cp
    dp_time = 0.0
    if shard_group > 1:  # an all-gather is half a ring all-reduce: two of bf16
        message = 2 * parameters / (tp * pp)  # and a reduce-scatter of fp32 (x2)
        ring = alpha_beta_time(
            "ring", message, shard_group, dp_link.latency, dp_link.bandwidth
        )
        dp_time = 2 * ring
    exposed_dp = max(0.0, dp_time - compute)
    return {"compute": compute, "bubble": bubble, "tp": tp_time, "dp": exposed_dp}


def tiny_gpt_state_bytes(config, dp: int, tp: int, bytes_per_value: int = 4):
    """Bytes of parameters, gradients and Adam's two moments one rank holds for
    19's :class:`~multigpu.gpt4d.model.TinyGPT` under FSDP2 over dp (rows cut with
    ``ceil``) and 15's block plan over tp: q, k, v, fc1 cut by rows with their
    biases, out and fc2 by columns with their biases whole; LayerNorms,
    embeddings (the head is tied) whole (20)."""
    d, f = config.dim, config.ffn
    per_block = [((d,), None), ((d,), None)] * 2  # two LayerNorms
    per_block += [((d, d), 0), ((d,), 0)] * 3  # q, k, v
    per_block += [((d, d), 1), ((d,), None)]  # out
    per_block += [((f, d), 0), ((f,), 0), ((d, f), 1), ((d,), None)]  # fc1, fc2
    root = [((config.vocab, d), None), ((config.seq_len, d), None)]
    root += [((d,), None), ((d,), None)]  # ln_f
    shapes = root + per_block * config.layers
    numel = sum(shard_numel(_local(s, cut, tp), dp) for s, cut in shapes)
    return {
        "parameters": numel * bytes_per_value,
        "gradients": numel * bytes_per_value,
        "optimizer": 2 * numel * bytes_per_value,
    }
