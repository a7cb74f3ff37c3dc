"""Tests for multigpu.costmodel.step: the step-time model of notebook 12."""

import math

import pytest

from multigpu import costmodel

FREE = costmodel.Link("free", math.inf, 0.0)
SLOW = costmodel.Link("slow", 1e9, 1e-4)
WORK = costmodel.Workload("toy", parameters=10_000_000, compute=0.1, batch=32)


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
