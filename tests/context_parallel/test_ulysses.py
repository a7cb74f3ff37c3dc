"""Ulysses on 1, 2 and 4 ranks equals one process, forward and backward, causal and
not, on even, uneven and empty shards; it refuses heads the world size does not
divide, by name, before any rank starts; each rank sends the bytes of the formula,
n/2 times less than the ring's forward when n divides the sequence; its all-to-all
turns each rank's tokens of every head into every token of its heads."""

import pytest
import torch

from multigpu.context_parallel import make_attention_case, one_process_attention
from multigpu.costmodel.context_parallel import ring_attention_bytes, ulysses_bytes
from multigpu.ranks.context_parallel import run_attention
from tests.context_parallel.problem import (
    ALL_TO_ALL_HEADS,
    ALL_TO_ALL_TOKENS,
    TOLERANCE,
)


def test_ulysses_equals_one_process_forward_and_backward(launched):
    world_size, results = launched
    runs = {k: r for k, r in results["attention"].items() if k[0] == "ulysses"}
    assert {key[3] for key in runs} == {16, 13, 3} and {key[2] for key in runs} == {
        False, True
    }  # fmt: skip
    for key, run in runs.items():
        reference = one_process_attention(results["cases"][key])
        for name, tensor in reference.items():
            difference = (getattr(run, name) - tensor).abs().max().item()
            assert difference < TOLERANCE[key[4]], (world_size, key, name, difference)


def test_each_rank_sends_the_bytes_of_the_formula(launched):
    world_size, results = launched
    for key, run in results["attention"].items():
        if key[0] != "ulysses":
            continue
        case = results["cases"][key]
        batch, heads, seq_len, head_dim = case.q.shape
        for rank, record in enumerate(run.records):
            formula = ulysses_bytes(
                seq_len, world_size, rank, batch, heads, head_dim, case.q.element_size()
            )
            sent = {"forward": record.forward_bytes, "backward": record.backward_bytes}
            assert sent == formula, (key, rank)


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_the_ring_sends_n_over_2_times_more_in_forward(world_size):
    seq_len = 8 * world_size
    ring = ring_attention_bytes(seq_len, world_size, 0, 1, 8, 4, 2)["forward"]
    ulysses = ulysses_bytes(seq_len, world_size, 0, 1, 8, 4, 2)["forward"]
    assert ring == world_size / 2 * ulysses


def test_ulysses_refuses_heads_the_world_size_does_not_divide():
    case = make_attention_case(8, causal=True, scheme="ulysses", heads=3)
    with pytest.raises(ValueError) as error:
        run_attention([case], world_size=2)
    assert str(error.value) == (
        "Ulysses needs the number of heads (3) to be divisible by the world size "
        "(2): each rank attends with whole heads. Use a world size in [1, 3], or "
        "ring attention, which splits the sequence only."
    )


def test_ulysses_refuses_the_zigzag_layout():
    case = make_attention_case(8, causal=True, layout="zigzag", scheme="ulysses")
    with pytest.raises(ValueError, match="Unknown Ulysses layout 'zigzag'"):
        case.check(2)


def test_the_all_to_all_trades_tokens_for_heads(launched):
    """Entry 10·token + head: before, rank r holds its tokens of every head; after,
    every token of its heads, in sequence order."""
    world_size, results = launched
    table = (
        torch.arange(ALL_TO_ALL_TOKENS)[:, None] * 10
        + torch.arange(ALL_TO_ALL_HEADS)[None, :]
    )  # (tokens, heads)
    tokens = table.tensor_split(world_size, dim=0)
    heads = table.tensor_split(world_size, dim=1)
    for rank, tables in enumerate(results["all_to_all"]):
        assert torch.equal(tables["before"], tokens[rank]), rank
        assert torch.equal(tables["after"], heads[rank]), rank
