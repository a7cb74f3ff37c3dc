"""Tests for multigpu.collectives: hand-made all-reduce equals dist.all_reduce."""

import math

import pytest
import torch
from torch.testing import assert_close

from multigpu import collectives as C
from multigpu.launch import spawn

# (shape, dtype): sizes divisible by 1..4 or not, smaller than the world, empty,
# several dimensions, floats and integers, and chunks larger than PIECE_BYTES.
CASES = [
    ((12,), torch.float32),
    ((10,), torch.float32),
    ((3,), torch.float64),
    ((1,), torch.float32),
    ((0,), torch.float32),
    ((5, 7), torch.float32),
    ((13,), torch.int64),
    ((2, 3), torch.int32),
    ((3 * 2**18 + 5,), torch.float32),  # 3 MiB: the ring adds chunks in 1 MiB pieces
    # 12 MiB + 4 bytes: on 2, 3 and 4 ranks chunk 0 needs one piece more than the
    # others, so a rank that cut by the wrong chunk would send mismatched pieces.
    ((12 * 2**18 + 1,), torch.float32),
]


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def compared(request):
    world_size = request.param
    return world_size, spawn(C.compare_all_reduces, world_size, CASES, timeout=10.0)


def test_results_equal_dist_all_reduce(compared):
    world_size, per_rank = compared
    for rows in per_rank:
        for row in rows:
            expected = row["dist.all_reduce"]
            assert expected.shape == row["shape"]
            assert row["naive"].dtype == row["ring"].dtype == row["dtype"]
            assert_close(row["naive"], expected)
            assert_close(row["ring"], expected)


def test_results_equal_the_sum_of_the_inputs(compared):
    world_size, per_rank = compared
    for case, row in zip(CASES, per_rank[0], strict=True):
        shape, dtype = case
        inputs = [C.rank_tensor(rank, shape, dtype) for rank in range(world_size)]
        assert_close(row["ring"], torch.stack(inputs).sum(0).to(dtype))


def test_bytes_sent_equal_the_formulas(compared):
    world_size, per_rank = compared
    for rank, rows in enumerate(per_rank):
        for row in rows:
            numel = math.prod(row["shape"])
            element_size = torch.empty((), dtype=row["dtype"]).element_size()
            nbytes = numel * element_size
            assert row["naive bytes"] == C.naive_bytes_per_rank(
                nbytes, world_size, rank
            )
            assert row["ring bytes"] == C.ring_bytes_per_rank(
                numel, element_size, world_size, rank
            )
            if numel % world_size == 0:
                assert row["ring bytes"] == C.ring_bytes_theory(nbytes, world_size)


def test_ring_bytes_formula_on_examples():
    # 12 float32 on 4 ranks: 2 * 3/4 * 48 bytes each.
    assert [C.ring_bytes_per_rank(12, 4, 4, r) for r in range(4)] == [72] * 4
    # 10 elements on 4 ranks are chunks 3,3,2,2: rank 0 skips chunks 1 and 2.
    assert C.chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert [C.ring_bytes_per_rank(10, 1, 4, r) for r in range(4)] == [15, 16, 15, 14]
    assert C.chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert C.ring_bytes_per_rank(5, 4, 1, 0) == 0
    assert C.naive_bytes_per_rank(100, 4, 0) == 300
    assert C.naive_bytes_per_rank(100, 4, 3) == 100


def test_non_contiguous_tensors_are_reduced_in_place():
    rows = spawn(C.transposed_all_reduce, 2, timeout=10.0)
    for rank_rows in rows:
        assert_close(rank_rows["naive"], rank_rows["expected"])
        assert_close(rank_rows["ring"], rank_rows["expected"])


def test_ping_pong_sends_and_receives():
    assert spawn(C.ping_pong, 2, 1.5) == [[3.0], [3.0]]


def test_schedule_every_rank_sends_a_different_chunk_each_step():
    for world_size in range(1, 7):
        for step in range(world_size - 1):
            for rule in (C.reduce_scatter_send_chunk, C.all_gather_send_chunk):
                chunks = {rule(rank, step, world_size) for rank in range(world_size)}
                assert chunks == set(range(world_size))


def test_ring_states_end_with_every_rank_holding_all_data():
    for world_size in (1, 2, 3, 4):
        states = C.ring_states(world_size)
        assert len(states) == 2 * (world_size - 1) + 1
        everyone = set(range(world_size))
        assert all(h == everyone for row in states[-1]["holds"] for h in row)
        if world_size > 1:  # after reduce-scatter rank r owns chunk r + 1
            middle = states[world_size - 1]["holds"]
            for rank in range(world_size):
                assert middle[rank][(rank + 1) % world_size] == everyone


def test_simulated_ring_matches_the_sum_and_catches_a_wrong_schedule():
    tensors = [C.rank_tensor(rank, (10,), torch.float64) for rank in range(4)]
    total = torch.stack(tensors).sum(0)
    for result in C.simulate_ring_all_reduce(tensors):
        assert_close(result, total)
    wrong = C.simulate_ring_all_reduce(tensors, all_gather_chunk=lambda r, s, n: r)
    assert not all(torch.allclose(result, total) for result in wrong)


def test_cost_model_and_bus_bandwidth():
    alpha, bandwidth = 1e-5, 1e9
    ring = C.alpha_beta_time("ring", 1e6, 4, alpha, bandwidth)
    naive = C.alpha_beta_time("naive", 1e6, 4, alpha, bandwidth)
    assert ring == pytest.approx(6 * alpha + 1.5e6 / bandwidth)
    assert naive == pytest.approx(6 * (alpha + 1e6 / bandwidth))
    assert C.algorithm_bandwidth(1e9, 2.0) == 5e8
    assert C.bus_bandwidth(1e9, 2.0, 4) == pytest.approx(7.5e8)
    assert C.bus_bandwidth(1e9, 2.0, 1) == 0.0
    with pytest.raises(ValueError, match="Unknown algorithm"):
        C.alpha_beta_time("tree", 1e6, 4, alpha, bandwidth)


def test_timing_rows_have_the_expected_shape():
    rows = spawn(C.time_all_reduces, 2, [4096], 1, timeout=10.0)[0]
    assert [row["algorithm"] for row in rows] == ["naive", "ring", "dist.all_reduce"]
    assert [row["bytes sent"] for row in rows] == [4096, 4096, None]
    assert all(row["seconds"] > 0 and row["busbw GB/s"] > 0 for row in rows)


@pytest.mark.gpu(2)
def test_ring_with_nccl_equals_dist_all_reduce():
    cases = [((10,), torch.float32), ((13,), torch.int64)]
    for rows in spawn(C.compare_all_reduces, 2, cases, backend="nccl"):
        for row in rows:
            assert_close(row["ring"], row["dist.all_reduce"])
            assert_close(row["naive"], row["dist.all_reduce"])


def test_plot_ring_draws_one_panel_per_step():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = C.plot_ring(3)
    assert len(figure.axes) == 2 * (3 - 1) + 1
    assert figure.axes[0].get_title() == "reduce-scatter step 1"
    plt.close(figure)
