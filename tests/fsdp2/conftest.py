"""Set-up shared by the tests of multigpu.fsdp2: every hard case the registry gives
FSDP2 (tests/hard_cases.py) and every knob (on TiedFrozenNet) run once, in one
launch on 4 ranks and one on 2."""

import pytest
import torch

from multigpu.core.models import TiedFrozenNet
from multigpu.ranks import fsdp2 as fsdp2_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.fsdp2.problem import (
    LR,
    MAX_NORM,
    SETTINGS,
    TIMEOUT,
    counted_mlp,
    global_steps,
)
from tests.hard_cases import BY_NAME, cases_for, hard_case_model
from tests.ranks_fsdp2 import comm_debug_rank

# name: (case, dtype, micro-batches, knobs): each case of the registry as it is,
# then the knobs on the model that has every case of a sharded wrapper.
KNOB_CASE = BY_NAME["TiedFrozenNet"]
TRAIN_RUNS = {case.name: (case, torch.float64, 1, {}) for case in cases_for("fsdp2")}
TRAIN_RUNS |= {
    "plain float32": (KNOB_CASE, torch.float32, 1, {}),
    "keep": (KNOB_CASE, torch.float64, 1, {"reshard_after_forward": False}),
    "reshard to 2": (KNOB_CASE, torch.float64, 1, {"reshard_after_forward": 2}),
    "prefetch 2": (KNOB_CASE, torch.float64, 1, {"prefetch": 2}),
    "hsdp": (KNOB_CASE, torch.float64, 1, {"mesh": (2, 2)}),
    "hsdp float32": (KNOB_CASE, torch.float32, 1, {"mesh": (2, 2)}),
    "accumulate": (KNOB_CASE, torch.float64, 2, {}),
    "clip": (KNOB_CASE, torch.float64, 1, {"max_norm": MAX_NORM}),
    "mixed": (KNOB_CASE, torch.float32, 1, {"mixed": True}),
    "tiny hsdp": (BY_NAME["TinyNet"], torch.float64, 1, {"mesh": (2, 2)}),
}


def train_calls(names, world_size):
    calls = []
    for name in names:
        case, dtype, micro, knobs = TRAIN_RUNS[name]
        if "mesh" in knobs and world_size != 4:
            continue
        models = [case.build(dtype, seed=rank) for rank in range(world_size)]
        steps = global_steps(dtype, micro, steps=3 if micro == 1 else 2)
        calls.append((name, (fsdp2_ranks.train_rank, (models, steps, LR, knobs))))
    return calls


@pytest.fixture(scope="package")
def world4(tmp_path_factory):
    """{name: each rank's result, by rank} of one launch on 4 ranks."""
    path = str(tmp_path_factory.mktemp("export") / "full.pt")
    calls = train_calls(TRAIN_RUNS, 4) + [
        (
            "reshard",
            (fsdp2_ranks.reshard_rank, (counted_mlp(), global_steps()[0][0], SETTINGS)),
        ),
        (
            "zero",
            (
                fsdp2_ranks.zero_redundancy_rank,
                (hard_case_model(seed=1), global_steps(), LR, True),
            ),
        ),
        (
            "tied",
            (
                fsdp2_ranks.fully_shard_error_rank,
                (hard_case_model(), "encode", "decode"),
            ),
        ),
        ("meta", (fsdp2_ranks.meta_init_rank, (TiedFrozenNet, 0))),
        (
            "export",
            (
                fsdp2_ranks.export_rank,
                (hard_case_model(seed=1), global_steps(), LR, path),
            ),
        ),
    ]
    batch = global_steps()[0][0]
    calls.append(("comm debug", (comm_debug_rank, (counted_mlp(), batch))))
    per_rank = spawn(in_one_launch, 4, [call for _, call in calls], timeout=TIMEOUT)
    results = {name: [r[i] for r in per_rank] for i, (name, _) in enumerate(calls)}
    results["export path"] = path
    return results


@pytest.fixture(scope="package")
def world2():
    """{name: each rank's result, by rank} of one launch on 2 ranks."""
    batch = global_steps()[0][0]
    calls = train_calls([KNOB_CASE.name, "accumulate", "clip", "mixed"], 2) + [
        (
            f"prefetch {depth}",
            (fsdp2_ranks.prefetch_rank, (counted_mlp(), batch, depth)),
        )
        for depth in (0, 1, 2)
    ]
    calls.append(("meta", (fsdp2_ranks.meta_init_rank, (TiedFrozenNet, 0))))
    per_rank = spawn(in_one_launch, 2, [call for _, call in calls], timeout=TIMEOUT)
    return {name: [r[i] for r in per_rank] for i, (name, _) in enumerate(calls)}
