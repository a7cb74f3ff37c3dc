"""The planner: which DP x TP x PP x CP configurations fit, and how fast (20).

Given a model shape, a GPU's memory, a number of GPUs and a global batch,
:func:`plan_configurations` tries every grid dp·tp·pp·cp = GPUs that the model
allows (tp inside a node and dividing the key/value heads, pp dividing the
layers, cp dividing the sequence, dp dividing the batch, at least pp
micro-batches), with and without full activation recomputation, and predicts for
each, with the course's formulas:

- memory per GPU (:func:`predicted_memory`): FSDP2's fp32 parameters, gradients
  and Adam shards over dp·cp ranks and its units in flight (14b), of the
  1/(tp·pp) of the model a rank holds; activations by 17's 34·s·b·h rule for the
  layers of one stage, times the micro-batches 1F1B keeps on stage 0 (16); one
  micro-batch's fp32 logits (17);
- the step (:func:`~multigpu.costmodel.cluster.parallel_step_time`).

It is a model, not a measurement: activation memory follows the GPU rule (flash
attention, 16-bit norms, sequence parallelism), which notebook 20 shows this
CPU's kernels exceed.
"""

from __future__ import annotations

from dataclasses import dataclass

from multigpu.cluster.llama import LlamaShape
from multigpu.core.checks import check_number, check_positive_int
from multigpu.costmodel.cluster import parallel_step_time
from multigpu.costmodel.context_parallel import (
    logits_bytes,
    transformer_activation_bytes,
)
from multigpu.costmodel.fsdp2 import fsdp2_memory_per_rank, llama_parameter_counts
from multigpu.costmodel.hardware import LINKS, Machine

# NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16 (1,979 with sparsity),
# https://www.nvidia.com/en-us/data-center/h100/
H100_BF16_FLOPS = 989e12
H100_NODE = Machine(
    "8 x H100 SXM, InfiniBand",
    8,
    LINKS["NVLink 4 (H100)"],
    LINKS["InfiniBand HDR 200 Gb/s"],
)


@dataclass(frozen=True)
class Plan:
    """One configuration: its grid, whether activations are recomputed, the
    predicted bytes per GPU by kind and seconds per step by part (20)."""

    dp: int
    tp: int
    pp: int
    cp: int
    recompute: bool
    memory: dict[str, float]
    step: dict[str, float]

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    @property
    def step_seconds(self) -> float:
        return sum(self.step.values())

    @property
    def grid(self) -> str:
        return f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp}"


def predicted_memory(
    shape: LlamaShape,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    seq_len: int,
    micro_batches: int,
    recompute: bool = False,
) -> dict[str, float]:
    """Bytes on the busiest GPU (pipeline stage 0) by kind: "state" (fp32
    parameters, gradients, Adam), "in flight" (whole bf16 units), "activations",
    "logits" (20)."""
    counts = llama_parameter_counts(shape.as_dict())
    largest = max(counts["block"], shape.vocab * shape.dim) / tp
    ledger = fsdp2_memory_per_rank(counts["total"] / (tp * pp), largest, dp * cp)
    state = ledger["parameters"] + ledger["gradients"] + ledger["optimizer"]
    layers = shape.layers / pp
    one = transformer_activation_bytes(seq_len, 1, shape.dim, layers, cp, tp, recompute)
    held = min(pp, micro_batches) if pp > 1 else 1  # 1F1B's stage 0
    logits = logits_bytes(seq_len, shape.vocab, 1, cp, bytes_per_value=4) / tp
    return {
        "state": state,
        "in flight": ledger["in flight"],
        "activations": one * held,
        "logits": logits,
    }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_grids(
    shape: LlamaShape,
    gpus: int,
    global_batch: int,
    seq_len: int,
    devices_per_node: int = 8,
    max_cp: int = 8,
) -> list[tuple[int, int, int, int]]:
    """Every (dp, tp, pp, cp) with dp·tp·pp·cp = ``gpus`` that the model allows:
    tp at most a node and dividing the key/value heads, pp dividing the layers,
    cp at most ``max_cp`` and dividing the sequence, dp dividing the global
    batch, and with a pipeline at least pp micro-batches of one sequence (20)."""
    check_positive_int("gpus", gpus, "Pass the number of GPUs, e.g. gpus=64.")
    check_positive_int("global_batch", global_batch, "Pass sequences per step.")
    grids = []
    for tp in _divisors(gpus):
        if tp > devices_per_node or shape.kv_heads % tp:
            continue
        for pp in _divisors(gpus // tp):
            if shape.layers % pp:
                continue
            for cp in _divisors(gpus // (tp * pp)):
                dp = gpus // (tp * pp * cp)
                if cp > max_cp or seq_len % cp or global_batch % dp:
                    continue
                if pp > 1 and global_batch // dp < pp:
                    continue
                grids.append((dp, tp, pp, cp))
    return grids


def plan_configurations(
    shape: LlamaShape,
    gpu_memory: float,
    gpus: int,
    global_batch: int,
    seq_len: int,
    machine: Machine = H100_NODE,
    flops: float = 0.4 * H100_BF16_FLOPS,
    max_cp: int = 8,
) -> list[Plan]:
    """The configurations of ``gpus`` GPUs of ``gpu_memory`` bytes that fit one
    step of ``global_batch`` sequences of ``seq_len`` tokens, fastest first
    (:func:`valid_grids`); recomputation only where a grid does not fit without
    (20)."""
    check_number("gpu_memory", gpu_memory, "Pass bytes, e.g. 80 * GB.")
    counts = llama_parameter_counts(shape.as_dict())
    grids = valid_grids(
        shape, gpus, global_batch, seq_len, machine.devices_per_node, max_cp
    )
    plans = []
    for dp, tp, pp, cp in grids:
        micro_batches = global_batch // dp
        for recompute in (False, True):
            memory = predicted_memory(
                shape, dp, tp, pp, cp, seq_len, micro_batches, recompute
            )
            if sum(memory.values()) > gpu_memory:
                continue
            step = parallel_step_time(
                counts["total"], shape.layers, shape.dim, seq_len, global_batch,
                dp, tp, pp, cp, flops, machine.intra, machine.link(gpus), recompute,
            )  # fmt: skip
            plans.append(Plan(dp, tp, pp, cp, recompute, memory, step))
            break
    return sorted(plans, key=lambda plan: plan.step_seconds)
