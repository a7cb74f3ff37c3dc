"""Tests for multigpu.expert_parallel.costs and load: the byte formulas against
values worked out by hand, the loads per rank, and the lesson's claim that the
load-balancing loss evens out a skewed load over a short training (one process)."""

import torch

from multigpu.expert_parallel import (
    all_to_all_bytes,
    balanced_all_to_all_bytes,
    break_even_tokens,
    capped_all_to_all_bytes,
    imbalance,
    load_table,
    make_moe_classifier,
    replicated_experts_bytes,
    tokens_per_rank,
    train_one_process,
)


def test_all_to_all_bytes_by_hand():
    # 5 rows out, 3 in, dim 4, float64, 4 experts on 2 ranks: (5+3) rows forward
    # and (5+3) backward = 16 rows of 32 bytes, plus 2 counts of 8 bytes to 1 rank
    assert all_to_all_bytes(5, 3, 4, 8, 4, 2) == 16 * 32 + 16
    assert all_to_all_bytes(0, 0, 4, 8, 4, 1) == 0  # one rank sends nothing


def test_balanced_and_capped_bytes_by_hand():
    # n=8 tokens, top-2, 4 ranks: 16 rows, 12 of them to other ranks, 12 back in
    counts = 3 * 1 * 8  # E=4 over 4 ranks: one count to each of 3 others
    assert balanced_all_to_all_bytes(8, 2, 4, 8, 4, 4) == 4 * 12 * 32 + counts
    # capacity ceil(8*2/4 * 1.0) = 4 per expert: at most min(16, 3*4) = 12 rows
    # out and 3 ranks * 1 expert * 4 = 12 rows in
    assert capped_all_to_all_bytes(8, 2, 4, 8, 4, 4, 1.0) == 4 * 12 * 32 + counts
    # capacity 2: at most 6 out and 6 in
    assert capped_all_to_all_bytes(8, 2, 4, 8, 4, 4, 0.5) == 4 * 6 * 32 + counts


def test_replicated_experts_and_the_break_even():
    # 8 experts of 1000 parameters, 4 ranks, 2 bytes: 2*3/4 * 8000 * 2
    assert replicated_experts_bytes(8, 1000, 4, 2) == 24000.0
    n = break_even_tokens(8, 1000, top_k=2, dim=10)  # 8000 / 40 = 200 tokens
    assert n == 200.0
    for world in (2, 4, 8):  # at the break-even both send the same (counts aside)
        ep = balanced_all_to_all_bytes(n, 2, 10, 2, 8, world) - (world - 1) * 8 * (
            8 // world
        )
        assert abs(ep - replicated_experts_bytes(8, 1000, world, 2)) < 1e-6


def test_loads_per_rank_and_imbalance():
    assert tokens_per_rank([3, 1, 0, 4], 2) == [4, 4]
    assert tokens_per_rank([3, 1, 0, 4], 4) == [3, 1, 0, 4]
    assert imbalance([2, 2, 2, 2]) == 1.0
    assert imbalance([8, 0, 0, 0]) == 4.0
    assert imbalance([0, 0]) == 1.0
    lines = load_table({"run": [[3, 1, 0, 4], [2, 2, 2, 2]]}, steps=[0, 1], ep_size=2)
    # per expert [3, 1, 0, 4]: 4 over a mean of 2; per rank [4, 4]: even
    assert lines[1].split() == ["run", "0", "[3,", "1,", "0,", "4]", "2.00"] + [
        "[4,",
        "4]",
        "1.00",
    ]
    assert lines[2].split()[-4:] == ["1.00", "[4,", "4]", "1.00"]


def test_the_auxiliary_loss_evens_out_a_skewed_load():
    """The lesson's run: seed 0 starts with 55 of 96 tokens on one expert; 60 steps
    without the loss leave an expert with nothing, with it the load of the experts
    and of the ranks evens out."""
    generator = torch.Generator().manual_seed(3)
    X = torch.randn(96, 6, generator=generator, dtype=torch.float64)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    runs = {
        coef: train_one_process(make_moe_classifier(seed=0), X, y, 60, 0.5, coef)
        for coef in (0.0, 0.1)
    }
    start = runs[0.0].chosen_per_expert[0]
    assert start == runs[0.1].chosen_per_expert[0] and imbalance(start) > 2
    assert imbalance(runs[0.0].chosen_per_expert[-1]) > 2
    assert min(runs[0.0].chosen_per_expert[-1]) == 0
    assert imbalance(runs[0.1].chosen_per_expert[-1]) < 1.1
    assert runs[0.1].aux_losses[-1] < runs[0.0].aux_losses[-1]
    for run in runs.values():  # top-1 without a capacity: nothing dropped
        assert run.kept_per_expert == run.chosen_per_expert
        assert all(sum(loads) == 96 for loads in run.chosen_per_expert)
    # on 2 ranks: the busier rank does about 20% more than the mean without the
    # loss, within 10% with it
    by_rank = {
        c: imbalance(tokens_per_rank(r.chosen_per_expert[-1], 2))
        for c, r in runs.items()
    }
    assert 1.15 < by_rank[0.0] < 1.25 and by_rank[0.1] < 1.1
    assert imbalance(tokens_per_rank(start, 2)) > 1.4
