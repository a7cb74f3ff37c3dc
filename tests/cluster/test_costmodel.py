"""Tests for multigpu.costmodel.cluster: counts, bytes and seconds worked out by
hand for small shapes, and the limits of the step model."""

import pytest

from multigpu.cluster.llama import LlamaShape
from multigpu.costmodel.cluster import (
    fsdp_tp_collectives_per_step,
    llama_block_activation_bytes,
    llama_state_bytes,
    megatron_all_reduces_per_step,
    parallel_step_time,
    tiny_gpt_state_bytes,
)
from multigpu.costmodel.hardware import Link
from multigpu.gpt4d.model import GPTConfig, count_parameters

SMALL = LlamaShape("small", layers=2, dim=8, ffn_dim=12, heads=4, kv_heads=2, vocab=10)
FREE = Link("free", float("inf"), 0.0)


def test_collectives_of_three_blocks_by_hand():
    # FSDP2: 4 units (3 blocks + root) gathered in forward, 3 again in backward
    # (the root keeps its parameters), 4 reduce-scatters; TP: 3 x (2 + 5) + 2
    assert fsdp_tp_collectives_per_step(3, 4, 2) == {
        "all-gather (FSDP)": 7,
        "all-gather (TP)": 1,
        "all-reduce (TP)": 23,
        "reduce-scatter (FSDP)": 4,
    }
    assert fsdp_tp_collectives_per_step(3, 1, 1) == {}
    assert megatron_all_reduces_per_step(3) == 14


def test_state_bytes_of_a_small_shape_by_hand():
    # tp = 1, dp = 2: block = 2 norms of 8 + q 8x8 + k, v 4x8 + o 8x8 + 3 x 12x8
    # = 16 + 64 + 64 + 64 + 288 = 496 -> 248 each; root = 10x8 + 8 + 10x8 -> 84
    state = llama_state_bytes(SMALL, 2, 1)
    shards = 84 + 2 * 248
    assert state["sharded"] == state["gradients"] == 4 * shards
    assert state["optimizer"] == 8 * shards + 4 * (3 + 2 * 9)
    assert state["root whole"] == 2 * 168
    # tp = 4 cuts k and v (4 rows) into 1 row each; odd rows are padded by ceil
    assert llama_state_bytes(SMALL, 3, 4)["root whole"] == 2 * (3 * 1 * 8 * 2 + 3 * 3)


def test_one_blocks_activations_by_hand():
    # 16 tokens, dim 8, tp 2: norms 2 x (4*16*8*2 + 4*16 + 2*16*8) = 2 x 1344;
    # attention 2*2*16*8/2 + 2*2*16*4/2 + 4*1*4/2*16 = 256 + 128 + 128
    # (head 2, k and v 2 heads of 2); mlp 4*2*16*12/2 = 768
    assert llama_block_activation_bytes(SMALL, 2, 16) == {
        "norms": 2688,
        "attention": 512,
        "mlp": 768,
    }


def test_tiny_gpt_state_without_parallelism_is_16_bytes_per_parameter():
    config = GPTConfig(layers=2)
    total = sum(tiny_gpt_state_bytes(config, 1, 1).values())
    assert total == 16 * count_parameters(config)
    assert sum(tiny_gpt_state_bytes(config, 2, 1).values()) == total // 2


def step(**grid):
    return parallel_step_time(
        1e9, 8, 1024, 2048, 64, flops=1e12, tp_link=FREE, dp_link=FREE, **grid
    )


def test_one_gpu_is_compute_only():
    assert step(dp=1, tp=1, pp=1, cp=1) == {
        "compute": pytest.approx(6 * 1e9 * 64 * 2048 / 1e12),
        "bubble": 0.0,
        "tp": 0.0,
        "dp": 0.0,
    }


def test_the_bubble_is_16s_share_and_free_links_cost_nothing():
    parts = step(dp=4, tp=2, pp=4, cp=1)
    # 16 micro-batches on 4 stages: (p - 1)/m = 3/16 of the compute
    assert parts["bubble"] == pytest.approx(parts["compute"] * 3 / 16)
    assert parts["tp"] == parts["dp"] == 0.0
