"""FSDP2's knobs in bytes and collectives: what a rank holds and sends (14b).

Exact, for a small model whose parameter shapes are known
(:func:`fsdp2_parameter_bytes_after_forward`): FSDP2 cuts each parameter's rows
with ``torch.chunk`` and pads the last shard to ``ceil(rows / N)`` rows, so a
rank's shard of a (rows, *rest) parameter is ``ceil(rows / N) * prod(rest)``
numbers, and an all-gather brings back ``N`` times that. Between forward and
backward a unit with ``reshard_after_forward`` True keeps only its shard; False
keeps the all-gathered parameters too; an int k keeps them resharded over k ranks
(1/k of them) in the compute dtype. :func:`fsdp2_collectives_per_step` counts the
all-gathers and reduce-scatters of one step.

Per parameter, for a large model (:func:`fsdp2_bytes_per_parameter`,
:func:`fsdp2_memory_per_rank`): fp32 master shard 4/N, fp32 gradient shard 4/N,
Adam's two fp32 moments 8/N, where N is the shard dimension of the mesh (HSDP
replicates over the other), plus the compute-dtype parameters held whole between
forward and backward; while gradients accumulate without a reduce-scatter, the
whole model's unsharded gradients in ``reduce_dtype`` (fp32: 4 bytes); without
sharding, DDP's buckets, a second fp32 copy of the gradients unless
``gradient_as_bucket_view=True``. :data:`LLAMA3_8B` is the model of the "which
setting when" table; activations are left to the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from multigpu.core.checks import check_positive_int

# Llama 3 8B (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3;
# and the model's config.json on Hugging Face, meta-llama/Meta-Llama-3-8B):
# 32 layers, model dimension 4096, FFN dimension 14336, 32 attention heads of
# 128, 8 key/value heads, vocabulary 128256, untied input and output embeddings.
LLAMA3_8B = {
    "layers": 32,
    "dim": 4096,
    "ffn_dim": 14336,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 128256,
}


def llama_parameter_counts(shape: dict[str, int] = LLAMA3_8B) -> dict[str, int]:
    """Parameters of one transformer block and of the embeddings (input and output,
    untied) of a Llama-shaped model, and the total (14b)."""
    dim, head_dim = shape["dim"], shape["dim"] // shape["heads"]
    attention = 2 * dim * dim + 2 * dim * shape["kv_heads"] * head_dim  # q, o; k, v
    mlp = 3 * dim * shape["ffn_dim"]  # gate, up, down
    block = attention + mlp + 2 * dim  # two RMSNorm weights
    embeddings = 2 * shape["vocab"] * dim
    total = shape["layers"] * block + embeddings + dim  # the final norm
    return {"block": block, "embeddings": embeddings, "total": total}


def _check_reshard(reshard_after_forward: bool | int, world_size: int) -> None:
    if isinstance(reshard_after_forward, bool):
        return
    if (
        not isinstance(reshard_after_forward, int)
        or reshard_after_forward < 2
        or reshard_after_forward >= world_size
        or world_size % reshard_after_forward
    ):
        raise ValueError(
            f"reshard_after_forward={reshard_after_forward!r} is not True, False or "
            f"a divisor of the shard size {world_size} other than 1 and itself. "
            "Pass True, False or such a divisor (e.g. the GPUs per node)."
        )


def shard_numel(shape: Sequence[int], world_size: int) -> int:
    """Numbers one rank stores of a parameter of ``shape``: ``ceil(rows / N)``
    rows, the last ranks padded (FSDP2's ``_fsdp_param.py``) (14b)."""
    rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
    return math.ceil(rows / world_size) * rest


def fsdp2_parameter_bytes_after_forward(
    unit_shapes: Sequence[Sequence[Sequence[int]]],
    world_size: int,
    reshard_after_forward: bool | int = True,
    master_bytes: int = 4,
    compute_bytes: int | None = None,
) -> dict[str, int]:
    """Parameter bytes one rank holds between forward and backward, by kind:
    ``sharded`` (its master shards), ``unsharded`` (all-gathered parameters kept,
    reshard_after_forward False), ``post-forward`` (kept resharded over k ranks,
    an int k) (14b). ``unit_shapes``: the parameter shapes of each unit that ran
    in forward; ``compute_bytes``: MixedPrecisionPolicy's param_dtype size."""
    check_positive_int("world_size", world_size)
    _check_reshard(reshard_after_forward, world_size)
    compute_bytes = compute_bytes or master_bytes
    shards = [shard_numel(s, world_size) for unit in unit_shapes for s in unit]
    gathered = sum(shards) * world_size  # padded: every rank's shard as big
    held = {"sharded": sum(shards) * master_bytes, "unsharded": 0, "post-forward": 0}
    if reshard_after_forward is False:
        held["unsharded"] = gathered * compute_bytes
    elif reshard_after_forward is not True:
        held["post-forward"] = gathered // reshard_after_forward * compute_bytes
    return held


def fsdp2_collectives_per_step(
    units: int,
    reshard_after_forward: bool | int = True,
    micro_batches: int = 1,
    replicas: int = 1,
    units_with_gradients: int | None = None,
    root_keeps_parameters: bool = False,
    reshard_after_backward: bool = True,
) -> dict[str, int]:
    """Collectives FSDP2 issues in one optimizer step (14b): an all-gather per unit
    (of the ``units`` that run in forward) per micro-batch's forward, another in
    its backward unless the unit kept its parameters (``reshard_after_forward``
    False; the root under the default None, ``root_keeps_parameters``), then, once
    per step (gradients synced on the last micro-batch only), a reduce-scatter per
    unit with gradients and, under HSDP (``replicas`` > 1), an all-reduce after
    each. ``reshard_after_backward`` False between micro-batches: the parameters
    stay whole from one micro-batch's backward to the next one's forward."""
    for name, value in (("units", units), ("micro_batches", micro_batches)):
        check_positive_int(name, value)
    check_positive_int("replicas", replicas)
    with_gradients = units if units_with_gradients is None else units_with_gradients
    backward = 0 if reshard_after_forward is False else units - root_keeps_parameters
    kept = 0 if reshard_after_backward else (micro_batches - 1) * units
    return {
        "all-gather": micro_batches * (units + backward) - kept,
        "reduce-scatter": with_gradients,
        "all-reduce": with_gradients * (replicas > 1),
    }


def fsdp2_bytes_per_parameter(
    shards: int,
    reshard_after_forward: bool | int = True,
    mixed_precision: bool = True,
    accumulating: bool = False,
    gradient_as_bucket_view: bool = True,
) -> dict[str, float]:
    """Bytes per parameter per rank with Adam, ``shards`` ranks in the mesh's shard
    dimension, at the moment between forward and backward: the fp32 master,
    gradient and Adam shards, and the compute-dtype copies held whole (2 bytes in
    bf16, 4 in fp32), by ``reshard_after_forward``. True holds none of them (but a
    unit or two in flight, :func:`fsdp2_memory_per_rank`). ``accumulating``: the
    unsharded fp32 gradients of every parameter (sharded only); without sharding,
    ``gradient_as_bucket_view=False`` (DDP's default) adds its buckets (14b)."""
    check_positive_int("shards", shards)
    if shards > 1:
        _check_reshard(reshard_after_forward, shards)
    compute = 2 if mixed_precision else 4
    if reshard_after_forward is True or shards == 1:
        held = 0.0 if shards > 1 else float(compute * mixed_precision)
    elif reshard_after_forward is False:
        held = float(compute)
    else:
        held = compute / reshard_after_forward
    ledger = {
        "parameters": 4 / shards,
        "gradients": 4 / shards,
        "optimizer": 8 / shards,
        "held after forward": held,
    }
    if accumulating and shards > 1:
        ledger["unsharded gradients"] = 4.0  # reduce_dtype fp32, or fp32 itself
    if shards == 1 and not gradient_as_bucket_view:
        ledger["DDP buckets"] = 4.0
    return ledger


def fsdp2_memory_per_rank(
    parameters: float,
    largest_unit: float,
    shards: int,
    reshard_after_forward: bool | int = True,
    mixed_precision: bool = True,
    units_in_flight: int = 2,
    accumulating: bool = False,
    gradient_as_bucket_view: bool = True,
) -> dict[str, float]:
    """Bytes one rank holds at its peak without activations: the per-parameter
    categories of :func:`fsdp2_bytes_per_parameter` times ``parameters``, plus
    ``units_in_flight`` units of ``largest_unit`` parameters all-gathered in the
    compute dtype (the one computing and the one prefetched), plus that unit's
    unsharded gradient (compute dtype, and fp32 for the reduce-scatter);
    ``accumulating``, ``gradient_as_bucket_view``: as in
    :func:`fsdp2_bytes_per_parameter` (14b)."""
    per_parameter = fsdp2_bytes_per_parameter(
        shards,
        reshard_after_forward,
        mixed_precision,
        accumulating,
        gradient_as_bucket_view,
    )
    ledger = {name: value * parameters for name, value in per_parameter.items()}
    compute = 2 if mixed_precision else 4
    in_flight = units_in_flight * largest_unit * compute
    in_flight += largest_unit * (compute + 4 * mixed_precision)
    ledger["in flight"] = in_flight if shards > 1 else 0.0
    return ledger
