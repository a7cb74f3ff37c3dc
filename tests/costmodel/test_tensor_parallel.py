"""Tests for multigpu.costmodel.tensor_parallel: TP and SP traffic and activations,
worked out by hand (15). The bytes the hand-built layers really send are checked
against these formulas in tests/tensor_parallel/."""

import pytest

from multigpu.costmodel.tensor_parallel import (
    sp_bytes_per_layer,
    tp_activation_bytes,
    tp_all_reduce_bytes_per_layer,
)


def test_tp_bytes_worked_out_by_hand():
    # S = 2 * 8 * 16 values of 8 bytes = 2048 bytes; 4 all-reduces of 2(n-1)/n S.
    assert tp_all_reduce_bytes_per_layer(2, 8, 16, 1, 8) == 0
    assert tp_all_reduce_bytes_per_layer(2, 8, 16, 2, 8) == 4 * 2048
    assert tp_all_reduce_bytes_per_layer(2, 8, 16, 4, 8) == 4 * 1.5 * 2048
    # GPT-3-like layer: batch 1, seq 2048, hidden 12288, bf16, tp 8.
    gigabytes = tp_all_reduce_bytes_per_layer(1, 2048, 12288, 8, 2) / 1e9
    assert round(gigabytes, 4) == 0.3523


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_sp_sends_what_tp_sends(tp):
    assert sp_bytes_per_layer(2, 8, 16, tp, 8) == tp_all_reduce_bytes_per_layer(
        2, 8, 16, tp, 8
    )
    assert sp_bytes_per_layer(2, 8, 16, 2, 4) == 4 * 2 * 0.5 * 2 * 8 * 16 * 4


def test_activations_worked_out_by_hand():
    # T = 16 tokens, h = 8, ffn = 16, 4 heads, float64: one process.
    one = tp_activation_bytes(2, 8, 8, 16, 4, 1, False, 8)
    assert one == {
        "sequence": 2 * (16 * 8 + 32) * 8,
        "gathered": 2 * 16 * 8 * 8,
        "split": (16 * (32 + 32) + 2 * 4 * 64) * 8,
        "mask": 64,
    }
    tp = tp_activation_bytes(2, 8, 8, 16, 4, 4, False, 8)
    sp = tp_activation_bytes(2, 8, 8, 16, 4, 4, True, 8)
    assert tp["split"] == sp["split"] == one["split"] / 4
    assert tp["sequence"] == one["sequence"] and sp["sequence"] == one["sequence"] / 4
    assert tp["gathered"] == sp["gathered"] == one["gathered"]


@pytest.mark.parametrize("tp", [0, -1, 2.0])
def test_formulas_refuse_a_tp_that_is_not_a_rank_count(tp):
    with pytest.raises(ValueError) as error:
        tp_all_reduce_bytes_per_layer(1, 1, 1, tp, 4)
    assert str(error.value) == (
        f"tp must be a positive whole number of ranks, got {tp!r}. Pass the "
        "tensor-parallel world size (1 means no tensor parallelism)."
    )
