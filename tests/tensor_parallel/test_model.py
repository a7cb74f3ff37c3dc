"""Tests for multigpu.tensor_parallel.model: the one-process block's attention is
PyTorch's causal scaled-dot-product attention, and dropout masks are reproducible
(15)."""

import torch
from torch.nn import functional as F

from multigpu.tensor_parallel import causal_attention, dropout_mask, make_block


def test_causal_attention_equals_pytorch():
    q, k, v = torch.randn(3, 2, 4, 8, 5, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (causal_attention(q, k, v) - expected).abs().max().item() < 1e-12


def test_dropout_mask_is_a_function_of_shape_and_seed():
    mask = dropout_mask((2, 8, 8), 0.25, seed=3)
    assert torch.equal(mask, dropout_mask((2, 8, 8), 0.25, seed=3))
    assert not torch.equal(mask, dropout_mask((2, 8, 8), 0.25, seed=4))
    assert set(mask.unique().tolist()) == {0.0, 1 / 0.75}


def test_block_keeps_its_shape_and_its_layer_norms_are_not_trivial():
    block = make_block(hidden=8, heads=4, ffn=16)
    assert block(torch.randn(2, 5, 8, dtype=torch.float64)).shape == (2, 5, 8)
    assert not torch.equal(block.ln1.weight, torch.ones(8, dtype=torch.float64))
