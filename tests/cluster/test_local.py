"""Tests for multigpu.cluster.local and multigpu.cluster.support: LocalTensor
holds every rank's value, sums them in a collective, runs TP on 8 simulated ranks
equal to one process, and refuses FSDP2; the support table is found live."""

import torch

from multigpu.cluster.local import (
    local_all_reduce,
    local_fsdp2_error,
    local_tp_difference,
)
from multigpu.cluster.support import PROBES, WAYS, support_table


def test_an_all_reduce_leaves_the_sum_on_every_rank():
    assert local_all_reduce(4) == {r: [6.0, 6.0] for r in range(4)}


def test_tensor_parallel_on_eight_local_ranks_equals_one_process():
    float64 = local_tp_difference((2, 4), torch.float64)
    assert float64["output"] < 1e-12 and float64["gradient"] < 1e-12
    float32 = local_tp_difference((2, 2), torch.float32)
    assert float32["output"] < 1e-6 and float32["gradient"] < 1e-6


def test_fsdp2_fails_under_local_tensor_with_one_line():
    assert local_fsdp2_error() == (
        "RuntimeError: Attempted to call resize_() on an invalid python storage."
    )


def test_the_support_table_says_what_each_way_runs():
    table = support_table(4)
    assert list(table) == list(WAYS)
    assert all(list(row) == list(PROBES) for row in table.values())
    assert table["fake"]["all_reduce"] == "sum = 1"  # nothing moved
    assert table["threaded"]["all_reduce"] == "sum = 10"
    assert table["LocalTensor"]["all_reduce"] == "sum = 10"
    assert table["threaded"]["all_to_all_single"] == "rank 0 got [0, 10, 20, 30]"
    assert table["fake"]["send/recv"] == "returns"
    assert table["threaded"]["send/recv"].startswith("error: RuntimeError")
    assert table["LocalTensor"]["send/recv"].startswith("error: AttributeError")
    assert table["fake"]["FSDP2 step"] == table["threaded"]["FSDP2 step"] == "runs"
    assert table["LocalTensor"]["FSDP2 step"].startswith("error: RuntimeError")
