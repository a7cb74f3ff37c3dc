"""Tests for multigpu.costmodel.pipeline against values worked out by hand (the
measured side is in tests/pipeline/test_step.py and test_simulate.py)."""

import pytest

from multigpu.costmodel.communication import alpha_beta_time, ring_bytes_theory
from multigpu.costmodel.hardware import LINKS
from multigpu.costmodel.pipeline import (
    DECISION_GUIDE,
    MEGATRON_2021,
    bubble_overhead,
    in_flight_microbatches,
    parallel_bytes_per_rank,
    pipeline_bubble_fraction,
    pp_bytes_per_step,
    tp_seconds_per_layer,
)
from multigpu.costmodel.tensor_parallel import tp_all_reduce_bytes_per_layer


def test_bubble_fraction_by_hand():
    assert pipeline_bubble_fraction(4, 1) == 0.75
    assert pipeline_bubble_fraction(4, 8) == 3 / 11
    assert pipeline_bubble_fraction(1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 8, chunks=2) == 3 / 19  # interleaved


def test_bubble_overhead_is_narayanans_ratio():
    assert bubble_overhead(4, 8) == 3 / 8
    assert bubble_overhead(4, 8, chunks=3) == 1 / 8
    # the same bubble: idle/(idle + ideal) from idle/ideal
    ratio = bubble_overhead(4, 8)
    assert ratio / (1 + ratio) == pytest.approx(pipeline_bubble_fraction(4, 8))


def test_bubble_refuses_a_bad_count():
    with pytest.raises(ValueError, match="num_microbatches must be a whole number"):
        pipeline_bubble_fraction(4, 0)


def test_in_flight_by_hand():
    assert [in_flight_microbatches("1f1b", s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight_microbatches("1f1b", s, 4, 2) for s in range(4)] == [2, 2, 2, 1]
    assert in_flight_microbatches("gpipe", 3, 4, 8) == 8
    with pytest.raises(ValueError, match="Unknown schedule 'zb'"):
        in_flight_microbatches("zb", 0, 4, 8)


def test_pp_bytes_by_hand():
    # 41 samples of 16 float64 values: 5,248 bytes each way
    assert pp_bytes_per_step(41, 1, 16, 8, 0, 2) == 5248
    assert pp_bytes_per_step(41, 1, 16, 8, 1, 4) == 2 * 5248
    assert pp_bytes_per_step(41, 1, 16, 8, 0, 1) == 0


def test_parallel_bytes_combine_tp_pp_dp():
    P, layers, batch, seq, hidden = 1e9, 24, 64, 1024, 2048
    parts = parallel_bytes_per_rank(P, layers, batch, seq, hidden, dp=2, tp=4, pp=2)
    local = batch / 2
    assert parts["tp"] == 12 * tp_all_reduce_bytes_per_layer(local, seq, hidden, 4, 2)
    assert parts["pp"] == 2 * local * seq * hidden * 2
    assert parts["dp"] == ring_bytes_theory(P / 8 * 2, 2)
    alone = parallel_bytes_per_rank(P, layers, batch, seq, hidden, dp=1, tp=1, pp=1)
    assert alone == {"tp": 0.0, "pp": 0.0, "dp": 0.0}
    # per layer, TP sends 8(t-1)/t x what PP sends per boundary: 6x at t = 4
    assert tp_all_reduce_bytes_per_layer(local, seq, hidden, 4, 2) == 6 * (
        local * seq * hidden * 2
    )


def test_published_numbers_are_consistent():
    per_gpu = MEGATRON_2021["petaflops"] * 1e15 / MEGATRON_2021["gpus"]
    assert round(per_gpu / 1e12) == 163  # teraFLOP/s per GPU
    assert (
        round(per_gpu / (MEGATRON_2021["peak_teraflops_a100"] * 1e12), 2)
        == MEGATRON_2021["fraction_of_peak"]
    )  # A100 bf16
    assert len(DECISION_GUIDE) == 5


def test_tp_seconds_per_layer_is_four_ring_all_reduces():
    link = LINKS["NVLink 3 (A100)"]
    message = 8 * 2048 * 12288 * 2
    expected = 4 * alpha_beta_time("ring", message, 8, link.latency, link.bandwidth)
    assert tp_seconds_per_layer(8, 2048, 12288, 8, 2, link) == expected
    assert tp_seconds_per_layer(8, 2048, 12288, 1, 2, link) == 0.0
    slow = LINKS["InfiniBand HDR 200 Gb/s"]
    assert tp_seconds_per_layer(8, 2048, 12288, 8, 2, slow) > 10 * expected
