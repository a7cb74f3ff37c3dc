"""Tests for multigpu.tensor_parallel.vocab: vocabulary-parallel embedding and
cross-entropy equal the full softmax cross-entropy and its gradient, without ever
gathering the logits (15)."""

import pytest
import torch
from torch.nn import functional as F

from multigpu.tensor_parallel import (
    TensorParallelLM,
    max_difference,
    shard_lm_state,
    vocab_start,
)
from tests.tensor_parallel.problem import EXACT, VOCAB, large_logits, lm_and_data


def test_tiny_lm_loss_and_gradients_equal_one_process(launched):
    world_size, results = launched
    lm, tokens, target = lm_and_data()
    loss = F.cross_entropy(lm(tokens).flatten(0, 1), target.flatten())
    loss.backward()
    grads = {name: p.grad for name, p in lm.named_parameters()}
    for rank, result in enumerate(results["lm"]):
        assert abs(result["loss"].item() - loss.item()) < EXACT
        expected = shard_lm_state(grads, rank, world_size)
        assert max_difference(result["grads"], expected) < EXACT
        assert result["logits_shape"] == (2, 8, VOCAB // world_size)


def test_logits_are_never_gathered(launched):
    world_size, results = launched
    logits_bytes = 2 * 8 * VOCAB * 8
    for result in results["lm"]:
        # Embedding and block: 1 + 4 all-reduces of (2, 8, 8); the loss: an
        # all-gather of the maxima and two all-reduces of 16 values; head: 1.
        kinds = [r.kind for r in result["ledger"]]
        assert kinds.count("all-gather") == 1
        assert len(kinds) == 9
        n = world_size
        activations = 6 * 2 * (n - 1) / n * (2 * 8 * 8 * 8)  # (2, 8, 8) float64
        loss = (n - 1) * 16 * 8 + 2 * 2 * (n - 1) / n * 16 * 8  # 16 tokens
        assert sum(r.nbytes for r in result["ledger"]) == activations + loss
        assert loss < (n - 1) / n * logits_bytes or n == 1  # what gathering costs


def test_cross_entropy_of_large_logits_and_its_gradient(launched):
    world_size, results = launched
    logits, target = large_logits()
    full = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(full, target)
    loss.backward()
    for rank, result in enumerate(results["cross-entropy"]):
        assert torch.isfinite(result["loss"])
        assert abs(result["loss"].item() - loss.item()) < EXACT
        mine = full.grad.tensor_split(world_size, dim=-1)[rank]
        assert (result["grad"] - mine).abs().max().item() < EXACT
        kinds = [(r.kind, r.phase) for r in result["ledger"]]
        assert kinds == [("all-gather", "forward")] + [("all-reduce", "forward")] * 2


def test_vocab_not_divisible_is_refused_by_name():
    lm, _, _ = lm_and_data()
    with pytest.raises(ValueError) as error:
        TensorParallelLM(lm, 0, 3)
    assert str(error.value).startswith(
        "vocab=16 is not divisible by the tensor-parallel world size 3."
    )
    assert vocab_start(16, 3, 4) == 12
