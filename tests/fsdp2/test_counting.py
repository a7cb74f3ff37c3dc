"""Tests for multigpu.fsdp2.counting: the collectives FSDP2 issues and the parameter
bytes a rank holds, counted on 2 and 4 ranks, equal costmodel.fsdp2's formulas for
reshard_after_forward True/False/2, mixed precision, HSDP and accumulation; the
prefetch depth moves the all-gathers ahead of the computation, in forward and in
backward."""

import pytest

from multigpu.costmodel.fsdp2 import (
    fsdp2_collectives_per_step,
    fsdp2_parameter_bytes_after_forward,
)
from tests.fsdp2.conftest import KNOB_CASE
from tests.fsdp2.problem import SETTINGS

# TiedFrozenNet under shard_layers: embed, frozen, head, unused and the root (encode
# and decode, tied); unused never runs, frozen has no gradient, the root keeps its
# parameters after forward (FSDP2's default for the root)
HARD_UNITS = {"units": 4, "units_with_gradients": 3, "root_keeps_parameters": True}


def test_held_bytes_after_forward_equal_the_formula(world4):
    for rank_rows in world4["reshard"]:
        for row, (reshard, mixed) in zip(rank_rows, SETTINGS):
            shapes = [shape for shape in row["unit shapes"] if shape]  # root: none
            expected = fsdp2_parameter_bytes_after_forward(
                shapes, 4, reshard, master_bytes=8, compute_bytes=2 if mixed else 8
            )
            assert row["held"] == expected, (reshard, mixed)


def test_reshard_setting_changes_the_backward_all_gathers(world4):
    rows = {(r["reshard_after_forward"], r["mixed"]): r for r in world4["reshard"][0]}
    for (reshard, _mixed), row in rows.items():
        counts = fsdp2_collectives_per_step(3, reshard)
        kinds = [c["kind"] for c in row["forward"] + row["backward"]]
        assert kinds.count("all-gather") == counts["all-gather"]
        assert kinds.count("reduce-scatter") == counts["reduce-scatter"]
        assert {c["group size"] for c in row["forward"]} == {4}
        backward = {
            c["group size"] for c in row["backward"] if c["kind"] == "all-gather"
        }
        assert backward == ({2} if reshard == 2 else {4} if reshard else set())
    # bf16 parameters: a quarter of float64's bytes on the wire
    for reshard in (False, 2):
        wide = [c["bytes"] for c in rows[(reshard, False)]["forward"]]
        narrow = [c["bytes"] for c in rows[(reshard, True)]["forward"]]
        assert narrow == [size // 4 for size in wide]
        assert all(c["dtype"] == "bfloat16" for c in rows[(reshard, True)]["forward"])


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        (KNOB_CASE.name, {}),
        ("keep", {"reshard_after_forward": False}),
        # set explicitly, the root reshards too (only None keeps the root whole)
        ("reshard to 2", {"reshard_after_forward": 2, "root_keeps_parameters": False}),
        ("hsdp", {"replicas": 2}),
        ("accumulate", {"micro_batches": 2}),
    ],
)
def test_collectives_of_a_training_run_equal_the_formula(world4, name, knobs):
    steps = 2 if name == "accumulate" else 3
    per_step = fsdp2_collectives_per_step(**(HARD_UNITS | knobs))
    for result in world4[name]:
        assert result["counts"] == {k: steps * v for k, v in per_step.items()}


def test_forward_prefetch_depth_issues_all_gathers_ahead_of_compute(world2):
    orders = {
        0: [
            "all-gather 0",
            "compute 0",
            "all-gather 2",
            "compute 2",
            "all-gather 4",
            "compute 4",
        ],
        1: [
            "all-gather 0",
            "all-gather 2",
            "compute 0",
            "all-gather 4",
            "compute 2",
            "compute 4",
        ],
        2: [
            "all-gather 0",
            "all-gather 2",
            "all-gather 4",
            "compute 0",
            "compute 2",
            "compute 4",
        ],
    }
    for depth, expected in orders.items():
        for events in world2[f"prefetch {depth}"]:
            assert events["forward"] == expected


def test_backward_prefetch_is_one_unit_by_default_and_deeper_when_set(world2):
    # FSDP2 prefetches the previous unit in backward by itself (_backward_prefetch
    # in _fsdp_param_group.py): depth 0 and 1 give the same order; depth 2's
    # set_modules_to_backward_prefetch issues two ahead
    one_ahead = [
        "all-gather 4",
        "all-gather 2",
        "compute 4",
        "all-gather 0",
        "compute 2",
        "compute 0",
    ]
    two_ahead = [
        "all-gather 4",
        "all-gather 2",
        "all-gather 0",
        "compute 4",
        "compute 2",
        "compute 0",
    ]
    orders = {0: one_ahead, 1: one_ahead, 2: two_ahead}
    for depth, expected in orders.items():
        for events in world2[f"prefetch {depth}"]:
            assert events["backward"] == expected


def test_collective_log_puts_back_what_it_wrapped():
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from multigpu.fsdp2 import CollectiveLog

    def wrapped():
        return (
            dist.all_gather_single,
            dist.reduce_scatter_single,
            dist.all_reduce,
            FSDPState._pre_backward,
        )

    before = wrapped()
    with CollectiveLog() as log:
        assert all(a is not b for a, b in zip(wrapped(), before))  # wrapped inside
        log.mark("compute 0")
    assert wrapped() == before
    assert log.events == ["compute 0"] and log.count("all-gather") == 0


def test_torchs_comm_debug_mode_counts_the_same_on_cpu(world4):
    for torch_counts, ours in world4["comm debug"]:
        assert ours == {"all-gather": 6, "reduce-scatter": 3}
        assert torch_counts == {
            "c10d._allgather_base_": ours["all-gather"],
            "c10d._reduce_scatter_base_": ours["reduce-scatter"],
        }
