"""A self-attention block trained under context parallelism equals one process: ranks
that start from their own random weights take rank 0's, frozen projections get no
gradient on any rank, the weight gradients are summed over the ranks; on 1, 2 and 4
ranks, ring (both layouts) and Ulysses, uneven and empty shards, float64 and float32.
What each rank saves for backward is the formula's 6·b·t·hidden + b·H·t values;
plain attention in one process saves the t² term."""

import torch

from multigpu.context_parallel import (
    SavedBytes,
    make_attention_block,
    one_process_block_step,
    reference_attention,
)
from multigpu.costmodel.context_parallel import block_activation_bytes, tokens_per_rank
from tests.context_parallel.problem import TOLERANCE, block_steps, memory_steps


def test_a_step_equals_one_process_on_every_rank(launched):
    world_size, results = launched
    steps = block_steps()
    assert results["blocks"].keys() == steps.keys()
    for name, step in steps.items():
        block = make_attention_block(
            8, 4, step["x"].dtype, step["seed"], step["frozen"]
        )
        loss, reference = one_process_block_step(
            block, step["x"], step["target"], step["causal"]
        )
        tolerance = TOLERANCE[step["x"].dtype]
        for rank, result in enumerate(results["blocks"][name]):
            assert abs(result["loss"] - loss) < tolerance, (name, rank)
            assert result["gradients"].keys() == reference.keys()
            for key, gradient in reference.items():
                if key in step["frozen"]:
                    assert gradient is None and result["gradients"][key] is None
                    continue
                difference = (result["gradients"][key] - gradient).abs().max().item()
                assert difference < tolerance, (world_size, name, rank, key)


def test_ranks_start_from_different_weights():
    first, second = make_attention_block(seed=0), make_attention_block(seed=1)
    assert not torch.equal(first.q.weight, second.q.weight)


def test_each_rank_saves_the_bytes_of_the_formula(launched):
    world_size, results = launched
    for seq_len, ranks in results["memory"].items():
        tokens = tokens_per_rank(seq_len, world_size)
        measured = [result["saved_bytes"] for result in ranks]
        formula = [
            block_activation_bytes(t, batch=1, hidden=8, heads=2, bytes_per_value=8)
            for t in tokens
        ]
        assert measured == formula, (world_size, seq_len)
    for name, ranks in results["blocks"].items():
        step = block_steps()[name]
        if step["scheme"] != "ring":
            continue
        tokens = tokens_per_rank(step["x"].shape[1], world_size, step["layout"])
        formula = [
            block_activation_bytes(t, 2, 8, 4, step["x"].element_size()) for t in tokens
        ]
        assert [r["saved_bytes"] for r in ranks] == formula, name


def test_plain_attention_in_one_process_saves_the_quadratic_term():
    for seq_len, step in memory_steps().items():
        for causal in (False, True):
            block = make_attention_block(8, 2, seed=1)
            with SavedBytes(block) as counter:
                block(
                    step["x"], lambda q, k, v, c=causal: reference_attention(q, k, v, c)
                )
            formula = block_activation_bytes(
                seq_len, 1, 8, 2, 8, ring=False, causal=causal
            )
            assert counter.total == formula, (seq_len, causal)
