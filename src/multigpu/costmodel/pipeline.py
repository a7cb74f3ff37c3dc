"""What pipeline parallelism costs, and how it combines with TP and DP (16).

Taught in ``notebooks/16_pipeline_parallel.ipynb`` next to what
:mod:`multigpu.pipeline` measures. With p stages, m micro-batches and equal
forward and backward times on every stage, GPipe and 1F1B both leave
(p - 1)/(m + p - 1) of the step idle (the *bubble*); Narayanan et al. (2021)
write the same bubble as (p - 1)/m of the ideal time, and their interleaved
schedule (v chunks of layers per rank) divides it by v. GPipe holds the
activations of all m micro-batches at once, 1F1B those of at most p - s on
stage s. A stage sends each micro-batch's activation forward and receives its
gradient back: batch · seq · hidden values per boundary and direction per step,
far fewer than tensor parallelism's all-reduces in every layer
(:func:`multigpu.costmodel.tensor_parallel.tp_all_reduce_bytes_per_layer`).
"""

from __future__ import annotations

from multigpu.costmodel.communication import alpha_beta_time, ring_bytes_theory
from multigpu.costmodel.hardware import Link
from multigpu.costmodel.tensor_parallel import tp_all_reduce_bytes_per_layer

__all__ = [
    "DECISION_GUIDE",
    "MEGATRON_2021",
    "bubble_overhead",
    "in_flight_microbatches",
    "parallel_bytes_per_rank",
    "pipeline_bubble_fraction",
    "pp_bytes_per_step",
    "tp_seconds_per_layer",
]


def _check(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}.")
    return value


def pipeline_bubble_fraction(
    num_stages: int, num_microbatches: int, chunks: int = 1
) -> float:
    """The share of a step each stage sits idle: (p - 1)/(v·m + p - 1), for GPipe
    and 1F1B (v = 1) and interleaved 1F1B with v chunks per rank."""
    p, m = (
        _check("num_stages", num_stages),
        _check("num_microbatches", num_microbatches),
    )
    v = _check("chunks", chunks)
    return (p - 1) / (v * m + p - 1)


def bubble_overhead(num_stages: int, num_microbatches: int, chunks: int = 1) -> float:
    """The bubble over the ideal time m(t_f + t_b), (p - 1)/(v·m): Megatron-LM's
    (Narayanan et al., 2021) and the Ultra-Scale Playbook's convention (16)."""
    p, m = (
        _check("num_stages", num_stages),
        _check("num_microbatches", num_microbatches),
    )
    return (p - 1) / (_check("chunks", chunks) * m)


def in_flight_microbatches(
    schedule: str, stage: int, num_stages: int, num_microbatches: int
) -> int:
    """The most micro-batches whose activations stage ``stage`` holds at once:
    m for GPipe, min(p - stage, m) for 1F1B."""
    m = _check("num_microbatches", num_microbatches)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(num_stages - stage, m)
    raise ValueError(f"Unknown schedule {schedule!r}. Choose 'gpipe' or '1f1b'.")


def pp_bytes_per_step(
    batch: int,
    seq: int,
    hidden: int,
    bytes_per_value: int,
    stage: int,
    num_stages: int,
) -> int:
    """Bytes stage ``stage`` sends per step: the activations of the whole batch
    forward (unless it is the last stage) and their gradients backward (unless it
    is the first), batch·seq·hidden values each, whatever the micro-batches."""
    sides = (stage < num_stages - 1) + (stage > 0)
    return sides * batch * seq * hidden * bytes_per_value


def parallel_bytes_per_rank(
    parameters: float,
    layers: int,
    batch: int,
    seq: int,
    hidden: int,
    dp: int,
    tp: int,
    pp: int,
    bytes_per_value: int = 2,
) -> dict[str, float]:
    """Bytes one rank of an interior pipeline stage sends per step under dp x tp x
    pp (3-D parallelism), by kind: "tp" (its layers' all-reduces on its share of
    the batch), "pp" (activations and gradients of its share, whole on every TP
    rank: Megatron's scatter/gather optimisation would divide this by tp), "dp"
    (a ring all-reduce of its parameters' gradients)."""
    local_batch = batch / dp
    tp_bytes = (
        layers
        / pp
        * tp_all_reduce_bytes_per_layer(local_batch, seq, hidden, tp, bytes_per_value)
    )
    pp_bytes = (pp > 1) * 2 * local_batch * seq * hidden * bytes_per_value
    dp_bytes = ring_bytes_theory(parameters / (tp * pp) * bytes_per_value, dp)
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}


def tp_seconds_per_layer(
    batch: float, seq: int, hidden: int, tp: int, bytes_per_value: int, link: Link
) -> float:
    """Seconds one transformer layer waits for tensor parallelism's 4 ring
    all-reduces per step (α-β model over ``link``): they sit on the critical path,
    since the next operation needs their result."""
    message = batch * seq * hidden * bytes_per_value
    one = alpha_beta_time("ring", message, tp, link.latency, link.bandwidth)
    return 4 * one if tp > 1 else 0.0


# Narayanan et al. (2021), "Efficient Large-Scale Language Model Training on GPU
# Clusters Using Megatron-LM", SC'21, https://arxiv.org/abs/2104.04473 (abstract).
MEGATRON_2021 = {
    "parameters": 1e12,
    "gpus": 3072,
    "petaflops": 502,  # aggregate, per training iteration
    "fraction_of_peak": 0.52,  # per-GPU throughput over the A100's peak
    "interleaving_gain": 0.10,  # "can improve throughput by 10+%"
    # the A100's dense BF16 peak, from NVIDIA's A100 datasheet:
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "peak_teraflops_a100": 312,
    "source": "https://arxiv.org/abs/2104.04473",
}

DECISION_GUIDE = (
    (
        "the training state (weights, gradients, Adam) does not fit",
        "shard it over the data-parallel ranks: ZeRO / FSDP (13, 14)",
    ),
    (
        "the activations do not fit",
        "activation checkpointing (14); with tensor parallelism, sequence "
        "parallelism (15); with a pipeline, 1F1B rather than GPipe (at most p - s "
        "micro-batches held on stage s)",
    ),
    (
        "one layer is too slow or too big for one device",
        "tensor parallelism inside a node, on its fastest links: it all-reduces in "
        "every layer (15)",
    ),
    (
        "the model does not fit one node's devices, even with tensor parallelism",
        "pipeline parallelism across nodes: only activations and their gradients "
        "cross the slower link, once per stage boundary",
    ),
    (
        "too many ranks for the batch (each would get too few samples)",
        "trade data parallelism for TP or PP, which split the model, not the batch",
    ),
)
