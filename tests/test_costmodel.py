"""Tests for multigpu.costmodel: bytes per rank, α-β time and bus bandwidth."""

import math

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


# ----------------------------------------------------------------------------------
# The step-time model of notebook 12

FREE = costmodel.Link("free", math.inf, 0.0)
SLOW = costmodel.Link("slow", 1e9, 1e-4)
WORK = costmodel.Workload("toy", parameters=10_000_000, compute=0.1, batch=32)


def _rows(alpha, bandwidth, noise=0.0):
    rows = []
    for i, (world_size, nbytes) in enumerate(
        (n, s) for n in (2, 4) for s in (4096, 65536, 1 << 20, 4 << 20)
    ):
        exact = costmodel.alpha_beta_time("ring", nbytes, world_size, alpha, bandwidth)
        wobble = noise * (1 if i % 2 else -1)  # deterministic ±noise
        rows.append(
            {"bytes": nbytes, "world_size": world_size, "seconds": exact * (1 + wobble)}
        )
    return rows


@pytest.mark.parametrize("alpha, bandwidth", [(5e-5, 2e9), (1e-6, 1e11), (3e-4, 5e8)])
def test_fit_recovers_alpha_and_bandwidth_from_synthetic_times(alpha, bandwidth):
    fitted_alpha, fitted_bandwidth = costmodel.fit_alpha_beta(_rows(alpha, bandwidth))
    assert fitted_alpha == pytest.approx(alpha, rel=1e-9)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-9)
    # 2 % noise moves the fit by a few per cent, not by orders of magnitude
    noisy_alpha, noisy_bandwidth = costmodel.fit_alpha_beta(
        _rows(alpha, bandwidth, 0.02)
    )
    assert noisy_alpha == pytest.approx(alpha, rel=0.2)
    assert noisy_bandwidth == pytest.approx(bandwidth, rel=0.1)


def test_fit_refuses_rows_that_cannot_determine_both():
    one_size = [
        r for r in _rows(1e-5, 1e9) if r["bytes"] == 4096 and r["world_size"] == 2
    ]
    with pytest.raises(ValueError, match="at least two different sizes"):
        costmodel.fit_alpha_beta(one_size)
    shrinking = [
        {"bytes": 1 << 20, "world_size": 2, "seconds": 1e-3},
        {"bytes": 4 << 20, "world_size": 2, "seconds": 1e-4},
    ]
    with pytest.raises(ValueError, match="do not grow with the bytes"):
        costmodel.fit_alpha_beta(shrinking)


def test_one_device_costs_nothing_extra():
    for step in (
        costmodel.ddp_step(WORK, 1, SLOW, buckets=4),
        costmodel.dataparallel_step(WORK, 1, SLOW, host=0.01),
    ):
        assert step.total == WORK.compute
        assert step.communication == 0


@pytest.mark.parametrize("world_size", [2, 8, 64])
def test_free_links_scale_perfectly(world_size):
    single = costmodel.ddp_step(WORK, 1, FREE)
    for step in (
        costmodel.ddp_step(WORK, world_size, FREE, buckets=3),
        costmodel.dataparallel_step(WORK, world_size, FREE),
    ):
        assert step.total == WORK.compute
        assert costmodel.speedup(step, single) == pytest.approx(world_size)


def test_ddp_overlap_limits():
    n = 8
    comm = costmodel.alpha_beta_time(
        "ring", WORK.gradient_bytes, n, SLOW.latency, SLOW.bandwidth
    )
    none = costmodel.ddp_step(WORK, n, SLOW, overlap=0.0)
    assert none.total == pytest.approx(WORK.compute + comm)
    # full overlap hides everything that fits in backward, and no more
    backward = WORK.backward_share * WORK.compute
    full = costmodel.ddp_step(WORK, n, SLOW, overlap=1.0)
    assert full.hidden == pytest.approx(min(comm, backward))
    assert full.total == pytest.approx(WORK.compute + max(0.0, comm - backward))
    fast = costmodel.Link("fast", 1e12, 1e-6)
    assert costmodel.ddp_step(WORK, n, fast, overlap=1.0).total == WORK.compute
    with pytest.raises(ValueError, match="fraction in"):
        costmodel.ddp_step(WORK, n, SLOW, overlap=1.5)


def test_bucket_schedule_hides_all_but_the_last_bucket_when_links_keep_up():
    # one bucket: ready when backward ends, all of it exposed
    assert costmodel.bucket_exposed_time(0.01, 1, 0.5) == pytest.approx(0.01)
    # ten small buckets: each is sent before the next is ready; only the last shows
    assert costmodel.bucket_exposed_time(0.01, 10, 0.5) == pytest.approx(0.01)
    # buckets slower than backward produces them: they queue up
    assert costmodel.bucket_exposed_time(0.2, 4, 0.4) == pytest.approx(0.1 + 0.8 - 0.4)
    many = costmodel.ddp_step(WORK, 8, SLOW, buckets=8)
    one = costmodel.ddp_step(WORK, 8, SLOW, buckets=1)
    assert many.hidden > 0 == one.hidden
    assert many.total < one.total


def test_dataparallel_pays_for_device0_and_the_interpreter_lock():
    n = 4
    step = costmodel.dataparallel_step(WORK, n, SLOW, host=0.002)
    broadcast = (n - 1) * SLOW.latency + WORK.gradient_bytes / SLOW.bandwidth
    assert step.hidden == 0
    assert step.communication == pytest.approx(
        2 * broadcast + 2 * (n - 1) * SLOW.latency
    )
    assert step.host == pytest.approx(n * 0.002)
    assert step.total > costmodel.ddp_step(WORK, n, SLOW, buckets=1).total


def test_machines_run_rings_at_the_pace_of_their_slowest_link():
    nvlink, ib = (
        costmodel.LINKS["NVLink 2 (V100)"],
        costmodel.LINKS["InfiniBand EDR 100 Gb/s"],
    )
    dgx = costmodel.Machine("8 x V100", 8, nvlink, ib)
    assert dgx.link(8) is nvlink
    assert dgx.link(16).bandwidth == ib.bandwidth
    curve = costmodel.scaling_curve(WORK, dgx, [1, 8, 16])
    assert [s.world_size for s in curve] == [1, 8, 16]
    assert curve[2].communication > curve[1].communication
    with pytest.raises(ValueError, match="runs in one process on one node"):
        costmodel.scaling_curve(WORK, dgx, [16], method="DataParallel")
    with pytest.raises(ValueError, match="no link between nodes"):
        costmodel.Machine("one box", 4, nvlink).link(8)
    # PyTorch's 25 MB buckets: 40 MB of gradients make 2
    assert costmodel.scaling_curve(WORK, dgx, [8])[0] == costmodel.ddp_step(
        WORK, 8, nvlink, buckets=2
    )


def test_published_rows_are_predicted_and_every_large_miss_is_explained():
    table = costmodel.published_table()
    assert len(table) == len(costmodel.PUBLISHED) >= 8
    for row, line in zip(costmodel.PUBLISHED, table, strict=True):
        predicted = costmodel.predict(row)
        miss = predicted / row.seconds - 1
        if row.calibrates:  # the compute time was solved for on this row
            assert predicted == pytest.approx(row.seconds, rel=1e-9)
            assert line["miss"] == "calibrated"
        else:
            assert line["miss"] == f"{miss:+.0%}"
        if abs(miss) > 0.3:
            assert line["left out of the model"], f"{row.source}: miss not explained"
        assert row.url.startswith("https://")


def test_calibrate_compute_inverts_the_ddp_step():
    link = costmodel.LINKS["PCIe 3.0 x16"]
    for seconds in (0.05, 0.5):
        fitted = costmodel.calibrate_compute(WORK, 4, link, 3, seconds)
        step = costmodel.ddp_step(fitted, 4, link, 3)
        assert step.total == pytest.approx(seconds, rel=1e-9)
        assert 0 < fitted.compute < seconds


def test_step_models_refuse_a_world_or_buckets_below_one():
    with pytest.raises(ValueError) as error:
        costmodel.ddp_step(WORK, 0, SLOW)
    assert str(error.value) == (
        "world_size must be an integer of at least 1, got 0. Pass a number of "
        "devices, e.g. 8."
    )
    with pytest.raises(ValueError, match="^buckets must be an integer of at least 1"):
        costmodel.ddp_step(WORK, 2, SLOW, buckets=0)
    with pytest.raises(ValueError, match="^world_size must be an integer of at least"):
        costmodel.dataparallel_step(WORK, 0, SLOW)


# ----------------------------------------------------------------------------------
# Reduce-scatter, all-gather and the ZeRO stages (13)


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


def test_zero_formulas_worked_out_by_hand():
    per_parameter = costmodel.zero_bytes_per_parameter
    assert sum(per_parameter("DDP", 8).values()) == 16  # 4 + 4 + 8
    assert sum(per_parameter("ZeRO-1", 4).values()) == 10  # 4 + 4 + 8/4
    assert sum(per_parameter("ZeRO-2", 4).values()) == 7  # 4 + 12/4
    assert sum(per_parameter("ZeRO-3", 4).values()) == 4  # 16/4
    assert sum(per_parameter("DDP", 64, "mixed").values()) == 16  # 2 + 2 + 12
    assert sum(per_parameter("ZeRO-3", 8, "mixed").values()) == 2  # 16/8
    # The paper's example: 7.5B parameters, 64 GPUs, mixed precision.
    gigabytes = {
        stage: round(
            sum(costmodel.zero_memory_ledger(stage, 64, 7.5e9, "mixed").values()) / 1e9,
            2,
        )
        for stage in costmodel.ZERO_STAGES
    }
    assert gigabytes == {"DDP": 120.0, "ZeRO-1": 31.41, "ZeRO-2": 16.64, "ZeRO-3": 1.88}
    float64 = costmodel.zero_memory_ledger("DDP", 1, 10, element_size=8)
    assert sum(float64.values()) == 320
    assert costmodel.zero_bytes_sent_theory("DDP", 100, 4) == 150  # 2 * 3/4 * 100
    assert costmodel.zero_bytes_sent_theory("ZeRO-3", 100, 4) == 225  # 3 * 3/4 * 100
    assert costmodel.zero_bytes_sent_theory("ZeRO-2", 100, 1) == 0


def test_zero_exact_bytes_average_the_theory_when_shards_are_equal():
    # 40 parameters in layers of 20: 4 ranks cut the buffer and each layer evenly.
    for stage in costmodel.ZERO_STAGES:
        exact = [
            costmodel.zero_bytes_sent_per_rank(stage, [20, 20], 4, 4, rank)
            for rank in range(4)
        ]
        assert exact == [costmodel.zero_bytes_sent_theory(stage, 160, 4)] * 4
    # 10 parameters over 4 ranks: DDP sends a ring all-reduce, ZeRO-2 its halves.
    ddp = [costmodel.zero_bytes_sent_per_rank("DDP", [10], 4, 4, r) for r in range(4)]
    zero2 = [
        costmodel.zero_bytes_sent_per_rank("ZeRO-2", [10], 4, 4, r) for r in range(4)
    ]
    assert ddp == [costmodel.ring_bytes_per_rank(10, 4, 4, r) for r in range(4)]
    assert zero2 == [56, 60, 64, 60]  # rank 0: 28 + 28, rank 1: 28 + 32, ...


def test_zero_formulas_say_how_to_fix_bad_arguments():
    with pytest.raises(ValueError) as error:
        costmodel.zero_bytes_per_parameter("zero3", 4)
    assert str(error.value) == (
        "Unknown stage 'zero3'. Choose one of: DDP, ZeRO-1, ZeRO-2, ZeRO-3."
    )
    with pytest.raises(ValueError) as error:
        costmodel.zero_memory_ledger("DDP", 4, 10, precision="bf16")
    assert str(error.value) == "Unknown precision 'bf16'. Choose one of: fp32, mixed."
    with pytest.raises(ValueError, match="^world_size must be an integer of at least"):
        costmodel.zero_bytes_sent_theory("DDP", 100, 0)
