"""Tests for multigpu.costmodel.hardware: machines run rings at the pace of their
slowest link (12)."""

import pytest

from multigpu import costmodel

WORK = costmodel.Workload("toy", parameters=10_000_000, compute=0.1, batch=32)


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
