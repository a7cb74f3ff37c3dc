"""multigpu.costmodel.fsdp's formulas against values worked out by hand; the
tests of multigpu.fsdp check them against what FSDPByHand sends and holds."""

from multigpu.costmodel.fsdp import (
    fsdp_bytes_per_parameter,
    fsdp_bytes_sent_per_rank,
    fsdp_bytes_sent_theory,
    fsdp_memory_ledger,
    fsdp_peak_gathered_bytes,
    fsdp_prefetch_overhead_bytes,
    recompute_bytes,
)


def test_fsdp_formulas_worked_out_by_hand():
    assert fsdp_bytes_per_parameter(8) == {
        "parameters": 0.5,
        "gradients": 0.5,
        "optimizer": 1.0,
    }  # 16/8 bytes in all
    units = [10, 30, 20, 5]
    assert fsdp_peak_gathered_bytes(units, 0, 2) == 60  # the largest unit, bf16
    assert fsdp_peak_gathered_bytes(units, 1, 2) == 100  # 30 + 20
    assert fsdp_peak_gathered_bytes(units, 2, 4) == 240  # 10 + 30 + 20, fp32
    assert fsdp_peak_gathered_bytes(units, 0, 4, reshard_after_forward=False) == 260
    assert fsdp_prefetch_overhead_bytes(units, 1, 2) == 40
    # 8B parameters, 8 ranks: 7/8·8e9 per pass; bf16 gathers twice, fp32 reduce
    assert fsdp_bytes_sent_theory(8e9, 8, 2, 4) == 7e9 * (2 + 2 + 4)
    assert fsdp_bytes_sent_theory(8e9, 8, 2, 4, reshard_after_forward=False) == 7e9 * 6
    # 10 numbers over 4 ranks: chunks 3 3 2 2; rank 0 sends all but chunk 1 in the
    # all-gather (3 + 2 + 2) and all but its own in the reduce-scatter (3 + 2 + 2)
    assert fsdp_bytes_sent_per_rank([10], 4, 0, 2, 4) == 2 * 7 * 2 + 7 * 4
    assert fsdp_bytes_sent_per_rank([10], 4, 0, 2, 4, False) == 7 * 2 + 7 * 4
    ledger = fsdp_memory_ledger(
        800, 8, units, depth=1, param_bytes=2, activation_bytes=7
    )
    assert ledger == {
        "parameters": 400,
        "gradients": 400,
        "optimizer": 800,
        "gathered": 100,
        "activations": 7,
    }


def test_recomputing_a_segment_brings_back_its_blocks():
    assert recompute_bytes(1, 80.0) == 80.0  # checkpointing every block
    assert recompute_bytes(3, 80.0) == 240.0  # segments of 3 blocks
