"""Tests for multigpu.zero.zero3: ZeRO-3 by hand (its training: test_loop.py and,
on the hard cases with what it refuses, test_hard_cases.py)."""

import pytest
import torch

from multigpu import zero


def test_zero3_refuses_a_layer_it_cannot_shard():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    with pytest.raises(ValueError) as error:
        zero.shard_model(model, zero.Meter())
    assert str(error.value) == (
        "Layer 1 (LayerNorm) has parameters that ZeRO-3 by hand cannot shard: it "
        "shards nn.Linear layers only. Build the model from nn.Linear layers, "
        "activations and buffers, e.g. with make_mlp(), or train it with DDP, ZeRO-1 "
        "or ZeRO-2."
    )
