"""Ring attention on 1, 2 and 4 ranks equals one process, forward and backward
(float64 within 1e-12, float32 within 1e-5), causal and not, on lengths that divide
(16), do not divide (13) and leave a rank empty (3 on 4 ranks), contiguous and
zig-zag; so does the short ring without a mask; zig-zag refuses lengths it cannot
split by name; each rank sends the bytes of the formula, computes and skips the
blocks of the formula, and needs and computes the query-key products of the
formulas."""

import pytest
import torch

from multigpu.context_parallel import (
    make_attention_case,
    one_process_attention,
    reference_attention,
    simulate_ring_attention,
    unshard_sequence,
)
from multigpu.costmodel.context_parallel import (
    attention_activation_bytes,
    causal_block_counts,
    causal_scores_needed,
    causal_scores_per_rank,
    ring_attention_bytes,
)
from multigpu.ranks.context_parallel import run_attention, run_simple_ring
from tests.context_parallel.problem import TOLERANCE

KEYS = ("out", "grad_q", "grad_k", "grad_v")


def ring_runs(results):
    return {key: run for key, run in results["attention"].items() if key[0] == "ring"}


def test_ring_attention_equals_one_process_forward_and_backward(launched):
    world_size, results = launched
    runs = ring_runs(results)
    layouts = {key[1] for key in runs}
    assert layouts == ({"contiguous", "zigzag"}), layouts  # 16 splits in zig-zag
    assert {key[3] for key in runs} == {16, 13, 3}
    for key, run in runs.items():
        reference = one_process_attention(results["cases"][key])
        for name in KEYS:
            difference = (getattr(run, name) - reference[name]).abs().max().item()
            assert difference < TOLERANCE[key[4]], (world_size, key, name, difference)


def test_the_one_process_ring_computes_what_the_ranks_compute(launched):
    world_size, results = launched
    for key, run in ring_runs(results).items():
        case = results["cases"][key]
        out, records = simulate_ring_attention(
            case.q, case.k, case.v, world_size, case.layout, case.causal
        )
        assert torch.equal(out, run.out), key  # the same blocks, merged alike
        assert [r.blocks for r in records] == [r.blocks for r in run.records], key


def test_each_rank_sends_the_bytes_of_the_formula(launched):
    world_size, results = launched
    for key, run in ring_runs(results).items():
        case = results["cases"][key]
        batch, heads, seq_len, head_dim = case.q.shape
        for rank, record in enumerate(run.records):
            formula = ring_attention_bytes(
                seq_len, world_size, rank, batch, heads, head_dim,
                case.q.element_size(), case.layout,
            )  # fmt: skip
            sent = {"forward": record.forward_bytes, "backward": record.backward_bytes}
            assert sent == formula, (key, rank)


def test_causal_blocks_computed_and_skipped_per_rank(launched):
    world_size, results = launched
    for layout in ("contiguous", "zigzag"):
        run = results["attention"][("ring", layout, True, 16, torch.float64)]
        counts = [record.counts() for record in run.records]
        assert counts == causal_block_counts(layout, world_size), layout
        scores = [record.scores_computed() for record in run.records]
        assert scores == causal_scores_per_rank(layout, 16, world_size), layout
        needed = [record.scores_needed() for record in run.records]
        assert needed == causal_scores_needed(layout, 16, world_size), layout
        assert sum(needed) == 16 * 17 // 2  # every pair key <= query, once
    if world_size == 4:  # the imbalance, and the balance
        contiguous = results["attention"][
            ("ring", "contiguous", True, 16, torch.float64)
        ]
        assert [r.scores_computed() for r in contiguous.records] == [16, 32, 48, 64]
        assert [r.scores_needed() for r in contiguous.records] == [10, 26, 42, 58]
        zigzag = results["attention"][("ring", "zigzag", True, 16, torch.float64)]
        assert [r.scores_computed() for r in zigzag.records] == [36] * 4
        assert [r.scores_needed() for r in zigzag.records] == [34] * 4


def test_needed_products_on_uneven_and_empty_shards(launched):
    world_size, results = launched
    for seq_len in (13, 3):
        run = results["attention"][("ring", "contiguous", True, seq_len, torch.float64)]
        needed = [record.scores_needed() for record in run.records]
        assert needed == causal_scores_needed("contiguous", seq_len, world_size)
        assert sum(needed) == seq_len * (seq_len + 1) // 2
    run = results["attention"][("ring", "contiguous", False, 13, torch.float64)]
    assert [r.scores_needed() for r in run.records] == [
        r.scores_computed() for r in run.records
    ]  # without a mask every product is needed


def test_the_short_ring_equals_one_process(launched):
    world_size, results = launched
    for case, pieces in results["simple"]:
        out = unshard_sequence(pieces, "contiguous", case.q.shape[2])
        reference = reference_attention(case.q, case.k, case.v, causal=False)
        difference = (out - reference).abs().max().item()
        assert difference < TOLERANCE[case.q.dtype], (world_size, difference)


@pytest.mark.parametrize(
    ("causal", "seq_len"), [(True, 8), (False, 7)], ids=["causal", "uneven"]
)
def test_the_short_ring_refuses_what_it_does_not_take(causal, seq_len):
    case = make_attention_case(seq_len, causal=causal)
    with pytest.raises(ValueError) as error:
        run_simple_ring([case], world_size=2)
    message = str(error.value)
    assert message.startswith("the short ring takes no mask and the same number")
    assert f"causal={causal} and {seq_len} tokens on 2 ranks" in message


def test_without_a_mask_no_block_is_skipped(launched):
    world_size, results = launched
    run = results["attention"][("ring", "contiguous", False, 16, torch.float64)]
    for record in run.records:
        assert record.counts() == {"full": world_size, "causal": 0, "skip": 0}


@pytest.mark.parametrize("seq_len", [13, 6])
def test_zigzag_refuses_a_length_it_cannot_split_before_any_rank_starts(seq_len):
    case = make_attention_case(seq_len, causal=True, layout="zigzag")
    with pytest.raises(ValueError) as error:
        run_attention([case], world_size=2)
    message = str(error.value)
    assert message.startswith(
        f"zig-zag sharding needs the sequence length ({seq_len}) to be divisible by "
        "2 x world size (4)"
    )
    assert "Pad the sequence to" in message and "\n" not in message


def test_each_rank_keeps_the_activation_bytes_of_the_formula(launched):
    """Ring attention keeps each rank's own tokens only; Ulysses (plain attention
    inside) the whole sequence's probabilities for its heads."""
    world_size, results = launched
    for key, run in results["attention"].items():
        case = results["cases"][key]
        batch, heads, seq_len, head_dim = case.q.shape
        formula = [
            attention_activation_bytes(
                seq_len,
                world_size,
                rank,
                batch,
                heads,
                head_dim,
                case.q.element_size(),
                case.scheme,
                case.causal,
                case.layout,
            )  # fmt: skip
            for rank in range(world_size)
        ]
        assert run.saved_bytes == formula, key
