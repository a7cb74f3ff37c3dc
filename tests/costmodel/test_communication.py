"""Tests for multigpu.costmodel.communication: bytes per rank, α-β time and bus
bandwidth (07); reduce-scatter and all-gather bytes (13)."""

import pytest

from multigpu import costmodel


def test_ring_and_naive_bytes_on_examples():
    # 12 float32 on 4 ranks: 2 * 3/4 * 48 bytes each.
    assert [costmodel.ring_bytes_per_rank(12, 4, 4, r) for r in range(4)] == [72] * 4
    # 10 elements on 4 ranks are chunks 3,3,2,2: rank 0 skips chunks 1 and 2.
    ring = [costmodel.ring_bytes_per_rank(10, 1, 4, r) for r in range(4)]
    assert ring == [15, 16, 15, 14]
    assert costmodel.ring_bytes_per_rank(5, 4, 1, 0) == 0
    assert costmodel.naive_bytes_per_rank(100, 4, 0) == 300
    assert costmodel.naive_bytes_per_rank(100, 4, 3) == 100
    assert costmodel.naive_bytes_per_rank(100, 1, 0) == 0
    assert costmodel.naive_bytes_per_rank(0, 4, 0) == 0


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
def test_ring_bytes_average_the_theory_whatever_the_chunks(world_size):
    for numel in (1, 5, 10, 12, 101):
        per_rank = [
            costmodel.ring_bytes_per_rank(numel, 4, world_size, r)
            for r in range(world_size)
        ]
        mean = sum(per_rank) / world_size
        assert mean == pytest.approx(costmodel.ring_bytes_theory(4 * numel, world_size))
        assert max(per_rank) - min(per_rank) <= 2 * 4  # chunks differ by one element


def test_ring_bytes_theory_tends_to_twice_the_tensor():
    assert costmodel.ring_bytes_theory(100, 2) == 100
    assert costmodel.ring_bytes_theory(100, 4) == 150
    assert costmodel.ring_bytes_theory(100, 1000) == pytest.approx(199.8)


def test_alpha_beta_time():
    alpha, bandwidth = 1e-5, 1e9
    ring = costmodel.alpha_beta_time("ring", 1e6, 4, alpha, bandwidth)
    naive = costmodel.alpha_beta_time("naive", 1e6, 4, alpha, bandwidth)
    assert ring == pytest.approx(6 * alpha + 1.5e6 / bandwidth)
    assert naive == pytest.approx(6 * (alpha + 1e6 / bandwidth))
    with pytest.raises(ValueError, match="Unknown algorithm 'bcube'"):
        costmodel.alpha_beta_time("bcube", 1e6, 4, alpha, bandwidth)


def test_tree_time_on_examples():
    alpha, bandwidth = 1e-5, 1e9
    # 8 ranks: 3 rounds up, 3 down, each a whole tensor.
    tree = costmodel.alpha_beta_time("tree", 1e6, 8, alpha, bandwidth)
    assert tree == pytest.approx(6 * (alpha + 1e6 / bandwidth))
    # 5 ranks need ceil(log2 5) = 3 rounds each way, like 8; one rank needs none.
    assert costmodel.alpha_beta_time("tree", 1e6, 5, alpha, bandwidth) == tree
    assert costmodel.alpha_beta_time("tree", 1e6, 1, alpha, bandwidth) == 0


def binomial_reduce_rounds(world_size):
    # Round k: every rank still holding a partial sum whose bit k is set sends it
    # to rank - 2**k, which adds it. Count rounds until rank 0 holds every rank.
    holds = {rank: {rank} for rank in range(world_size)}
    rounds = 0
    while len(holds[0]) < world_size:
        step = 2**rounds
        for sender in [r for r in holds if r & step]:
            holds[sender - step] |= holds.pop(sender)
        rounds += 1
    return rounds


@pytest.mark.parametrize("world_size", range(1, 18))
def test_tree_steps_count_the_rounds_of_a_binomial_reduce_and_broadcast(world_size):
    rounds = binomial_reduce_rounds(world_size)
    assert costmodel.tree_steps(world_size) == 2 * rounds  # the broadcast mirrors it
    assert 2 ** (rounds - 1) < world_size <= 2**rounds  # rounds = ceil(log2 n)


def test_tree_beats_the_ring_on_small_tensors_only_from_four_ranks():
    alpha, bandwidth = 5e-6, 100e9

    def faster(nbytes, world_size):
        tree = costmodel.alpha_beta_time("tree", nbytes, world_size, alpha, bandwidth)
        ring = costmodel.alpha_beta_time("ring", nbytes, world_size, alpha, bandwidth)
        return "tree" if tree < ring else "ring"

    assert [faster(4e3, n) for n in (2, 3, 4, 16)] == ["ring", "ring", "tree", "tree"]
    assert [faster(100e6, n) for n in (2, 4, 16)] == ["ring"] * 3


def test_bus_bandwidth():
    assert costmodel.algorithm_bandwidth(1e9, 2.0) == 5e8
    assert costmodel.bus_bandwidth(1e9, 2.0, 4) == pytest.approx(7.5e8)
    assert costmodel.bus_bandwidth(1e9, 2.0, 1) == 0.0


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_a_ring_without_latency_runs_at_the_link_bandwidth(world_size):
    # busbw is defined so that an ideal ring reaches B whatever n is; latency
    # brings it down to B / (1 + n α B / S) (exercise 3 of notebook 07).
    bandwidth, nbytes = 100e9, 64e6
    seconds = costmodel.alpha_beta_time("ring", nbytes, world_size, 0.0, bandwidth)
    assert costmodel.bus_bandwidth(nbytes, seconds, world_size) == pytest.approx(
        bandwidth
    )
    alpha = 5e-6
    seconds = costmodel.alpha_beta_time("ring", nbytes, world_size, alpha, bandwidth)
    expected = bandwidth / (1 + world_size * alpha * bandwidth / nbytes)
    assert costmodel.bus_bandwidth(nbytes, seconds, world_size) == pytest.approx(
        expected
    )


def test_reduce_scatter_and_all_gather_bytes_worked_out_by_hand():
    # 10 elements over 4 ranks are chunks of 3, 3, 2, 2 (float32: 4 bytes each).
    # Reduce-scatter: rank r sends every chunk but its own.
    reduce_scatter = costmodel.reduce_scatter_bytes_per_rank
    all_gather = costmodel.all_gather_bytes_per_rank
    assert [reduce_scatter(10, 4, 4, r) for r in range(4)] == [28, 28, 32, 32]
    # All-gather: every chunk but its right neighbour's, which arrives last.
    assert [all_gather(10, 4, 4, r) for r in range(4)] == [28, 32, 32, 28]
    assert reduce_scatter(10, 4, 1, 0) == 0
    # Together, over all ranks, they send what notebook 07's ring all-reduce sends
    # (whose reduce-scatter leaves chunk r+1 on rank r, so ranks differ one by one).
    halves = sum(
        reduce_scatter(10, 4, 4, r) + all_gather(10, 4, 4, r) for r in range(4)
    )
    ring = sum(costmodel.ring_bytes_per_rank(10, 4, 4, r) for r in range(4))
    assert halves == ring == 240
