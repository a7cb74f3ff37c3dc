"""Tests for multigpu.costmodel.context_parallel against values worked out by hand
(the measured side is in tests/context_parallel/)."""

import pytest

from multigpu.costmodel.context_parallel import (
    attention_activation_bytes,
    block_activation_bytes,
    causal_block_counts,
    causal_scores_needed,
    causal_scores_per_rank,
    logits_bytes,
    longest_sequence,
    ring_attention_bytes,
    tokens_per_rank,
    transformer_activation_bytes,
    ulysses_bytes,
)


def test_tokens_per_rank_cut_as_tensor_split():
    assert tokens_per_rank(13, 4) == [4, 3, 3, 3]
    assert tokens_per_rank(3, 4) == [1, 1, 1, 0]
    assert tokens_per_rank(16, 4, "zigzag") == [4, 4, 4, 4]


def test_ring_bytes_by_hand():
    # 16 tokens on 4 ranks, 1 x 2 heads x 4 values of 8 bytes: 64 bytes per token
    assert ring_attention_bytes(16, 4, 0, 1, 2, 4, 8) == {
        "forward": 2 * 12 * 64,  # 3 blocks of 4 tokens, k and v
        "backward": 2 * 12 * 64 + 2 * 16 * 64,  # again, plus every block's dk, dv
    }
    # 13 tokens: 4, 3, 3, 3; a rank sends every block but its right neighbour's
    assert ring_attention_bytes(13, 4, 3, 1, 2, 4, 8)["forward"] == 2 * 9 * 64
    assert ring_attention_bytes(13, 4, 0, 1, 2, 4, 8)["forward"] == 2 * 10 * 64
    assert ring_attention_bytes(16, 1, 0, 1, 2, 4, 8) == {"forward": 0, "backward": 0}


def test_ulysses_bytes_by_hand():
    # 16 tokens on 2 ranks, 4 heads: rank 0 sends 8 tokens x 2 heads of q, k, v
    # (32 bytes per token and head) and the output of 8 tokens x 2 heads back
    assert ulysses_bytes(16, 2, 0, 1, 4, 4, 8) == {
        "forward": 3 * 8 * 2 * 32 + 8 * 2 * 32,
        "backward": 8 * 2 * 32 + 3 * 8 * 2 * 32,
    }
    assert ulysses_bytes(16, 1, 0, 1, 4, 4, 8) == {"forward": 0, "backward": 0}
    # uneven: 13 tokens on 4 ranks, rank 1 holds 3 of them
    assert ulysses_bytes(13, 4, 1, 1, 4, 4, 8)["forward"] == 3 * 3 * 3 * 32 + 10 * 32


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ring_sends_n_over_2_times_ulysses_in_forward(world_size):
    seq = 4 * world_size
    ring = ring_attention_bytes(seq, world_size, 1, 2, 8, 16, 2)["forward"]
    assert (
        ring
        == world_size / 2 * ulysses_bytes(seq, world_size, 1, 2, 8, 16, 2)["forward"]
    )


def test_causal_block_counts_by_hand():
    assert causal_block_counts("contiguous", 4) == [
        {"full": 0, "causal": 1, "skip": 3},
        {"full": 1, "causal": 1, "skip": 2},
        {"full": 2, "causal": 1, "skip": 1},
        {"full": 3, "causal": 1, "skip": 0},
    ]
    assert causal_block_counts("zigzag", 2) == [{"full": 3, "causal": 2, "skip": 3}] * 2


def test_causal_scores_by_hand():
    assert causal_scores_per_rank("contiguous", 16, 4) == [16, 32, 48, 64]
    assert causal_scores_per_rank("zigzag", 16, 4) == [36] * 4  # 9 blocks of 2 x 2
    assert causal_scores_per_rank("contiguous", 13, 4) == [16, 21, 30, 39]


def test_block_activations_by_hand():
    # 8 tokens, batch 2, hidden 8, 4 heads, float64: 6·2·8·8 + 2·4·8 values
    assert block_activation_bytes(8, 2, 8, 4, 8) == (768 + 64) * 8
    assert block_activation_bytes(1, 2, 8, 4, 8) == (80 + 8) * 8  # context: a view
    assert block_activation_bytes(8, 2, 8, 4, 8, ring=False) == (640 + 512) * 8
    assert block_activation_bytes(8, 2, 8, 4, 8, ring=False, causal=True) == (
        (640 + 512) * 8 + 64
    )


def test_transformer_activations_by_hand():
    per_layer = 34 * 8192 * 4096  # bytes, 16-bit, flash attention
    assert transformer_activation_bytes(8192, 1, 4096, 32) == 32 * per_layer
    assert transformer_activation_bytes(8192, 1, 4096, 32, cp=8) == 4 * per_layer
    assert transformer_activation_bytes(8192, 1, 4096, 32, cp=2, tp=4) == 4 * per_layer
    recomputed = 32 * 2 * 8192 * 4096 + per_layer
    assert transformer_activation_bytes(8192, 1, 4096, 32, recompute=True) == recomputed


def test_longest_sequence_by_hand():
    per_token = 34 * 4096 * 32  # 4,456,448 bytes
    assert longest_sequence(80e9, 20e9, 4096, 32) == int(60e9 // per_token) == 13463
    assert longest_sequence(80e9, 20e9, 4096, 32, cp=4) == int(4 * 60e9 // per_token)
    assert longest_sequence(80e9, 90e9, 4096, 32) == 0


def test_attention_activations_by_hand():
    # 16 tokens, 4 heads of 4, float64: ring on 4 ranks keeps q, k, v, out of its
    # 4 tokens (4·4·4·4 values) and their log-sum-exps (4·4)
    assert attention_activation_bytes(16, 4, 0, 1, 4, 4, 8) == (256 + 16) * 8
    assert attention_activation_bytes(13, 4, 3, 1, 4, 4, 8) == (192 + 12) * 8
    # one process (Ulysses on 1 rank): q, k, v (3·4·16·4) and 16 x 16 probabilities
    one = (768 + 4 * 256) * 8
    assert attention_activation_bytes(16, 1, 0, 1, 4, 4, 8, "ulysses") == one
    assert (
        attention_activation_bytes(16, 1, 0, 1, 4, 4, 8, "ulysses", True) == one + 256
    )
    assert attention_activation_bytes(16, 2, 1, 1, 4, 4, 8, "ulysses") == one // 2


def test_needed_products_by_hand():
    # a query at position p needs p + 1 keys: 16 tokens on 4 ranks, contiguous
    assert causal_scores_needed("contiguous", 16, 4) == [
        1 + 2 + 3 + 4,
        5 + 6 + 7 + 8,
        9 + 10 + 11 + 12,
        13 + 14 + 15 + 16,
    ]
    # zig-zag, rank 0 holds 0, 1, 14, 15
    assert causal_scores_needed("zigzag", 16, 4) == [1 + 2 + 15 + 16] * 4
    assert causal_scores_needed("contiguous", 3, 4) == [1, 2, 3, 0]  # an empty rank
    assert causal_scores_needed("contiguous", 13, 4) == [10, 5 + 6 + 7, 8 + 9 + 10, 36]


def test_computed_exceeds_needed_by_the_masked_half_of_the_diagonal():
    # a t x t diagonal block computes t² products and needs t(t + 1)/2
    for layout, blocks, t in (("contiguous", 1, 4), ("zigzag", 2, 2)):
        computed = causal_scores_per_rank(layout, 16, 4)
        needed = causal_scores_needed(layout, 16, 4)
        assert [c - n for c, n in zip(computed, needed)] == [
            blocks * t * (t - 1) // 2
        ] * 4


def test_logits_bytes_by_hand():
    assert logits_bytes(150_000, 128_256) == 150_000 * 128_256 * 2  # 16-bit
    assert logits_bytes(150_000, 128_256, cp=4) == 150_000 / 4 * 128_256 * 2
    assert logits_bytes(10, 100, batch=2, bytes_per_value=4) == 10 * 2 * 100 * 4
