"""HookedFSDP calls a unit's four hooks at the right moments and logs what each left:
with the reference UnitHooks, on 2 ranks, every unit is gathered before its forward,
freed after it, gathered again before its backward and freed after it, one unit at a
time, and training equals one process on the hard cases."""

import torch

from multigpu import fsdp, zero
from multigpu.fsdp import UnitHooks
from multigpu.ranks.fsdp import unit_hooks_rank
from multigpu.runtime.launch import spawn
from tests.fsdp.conftest import CONFIG, TIMEOUT
from tests.hard_cases import hard_case_data, hard_case_model, tiny_model


def test_the_reference_hooks_follow_each_units_life_and_train_like_one_process():
    X, y = hard_case_data(dtype=torch.float64)
    models = [hard_case_model(torch.float64, seed=rank) for rank in range(2)]
    ranks = spawn(
        unit_hooks_rank, 2, UnitHooks, [(models, X, y, CONFIG)], timeout=TIMEOUT
    )
    reference = zero.train_one_process_adam(
        hard_case_model(torch.float64, seed=0), X, y, CONFIG
    ).parameters
    for (report,) in ranks:
        assert report["mistake"] is None
        assert report["peak gathered units"] == 1
        for name, value in reference.items():
            assert (report["parameters"][name] - value).abs().max() <= 1e-12, name
        log = [(e["moment"], e["unit"], e["calls"], e["holds"]) for e in report["log"]]
        units = ["embed", "encode+decode", "head"]  # "unused" never runs
        forward = [
            entry
            for unit in units
            for entry in [
                ("pre_forward", unit, ["allocate"], "parameters"),
                ("post_forward", unit, ["free"], None),
            ]
        ]
        backward = [
            entry
            for unit in units[::-1]
            for entry in [
                ("pre_backward", unit, ["allocate"], "parameters"),
                ("post_backward", unit, ["free"], None),
            ]
        ]
        assert log == forward + backward
        assert all(e["gradient"] == "mean" for e in report["log"] if "gradient" in e)
        assert not any(e.get("all-reduce") for e in report["log"])


def test_a_unit_starts_freed_and_allocate_brings_back_nan():
    model = fsdp.TiedFrozenNet()
    flat = fsdp.FlatUnit(0, ("embed",), model, rank=0, world_size=2, compute_dtype=None)
    calls = []
    unit = fsdp.HookedUnit(flat, calls)
    assert not unit.allocated and unit.shard.numel() == 21  # 42 numbers over 2
    unit.allocate()
    assert unit.allocated and unit.buffer.isnan().all()
    unit.free()
    assert not unit.allocated and calls == ["allocate", "free"]


def test_a_root_unit_with_an_empty_chunk_trains_like_one_process():
    X, y = hard_case_data(dtype=torch.float64)
    models = [tiny_model(torch.float64, seed=rank) for rank in range(3)]
    ranks = spawn(
        unit_hooks_rank, 3, UnitHooks, [(models, X, y, CONFIG)], timeout=TIMEOUT
    )
    reference = zero.train_one_process_adam(
        tiny_model(torch.float64, seed=0), X, y, CONFIG
    ).parameters  # 2 parameters over 3 ranks: rank 2's chunk is empty
    for (report,) in ranks:
        assert report["mistake"] is None
        assert [(e["moment"], e["unit"]) for e in report["log"]] == [
            ("pre_forward", "root"),
            ("post_forward", "root"),
            ("pre_backward", "root"),
            ("post_backward", "root"),
        ]
        for name, value in reference.items():
            assert (report["parameters"][name] - value).abs().max() <= 1e-12, name
