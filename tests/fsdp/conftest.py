"""Set-up shared by the tests of multigpu.fsdp: every FSDP-by-hand run of the hard
cases the registry gives it (tests/hard_cases.py), the prefetch depths, mixed
precision, FSDP2's bf16 run and the gradients a parameter no forward reads gets,
trained once per world size in one launch."""

import pytest
import torch

from multigpu.core.train import TrainConfig
from multigpu.fsdp import gather_parameters, make_block_stack, reduce_gradient
from multigpu.ranks import fsdp as fsdp_ranks
from multigpu.ranks.fsdp import mixed_precision_exercise_rank
from multigpu.runtime.launch import in_one_launch, spawn
from multigpu.zero import make_mlp
from tests.fsdp.ranks import unread_parameter_rank
from tests.hard_cases import (
    DTYPES,
    cases_for,
    hard_case_data,
    hard_case_model,
    refusals_for,
    refused_rank,
    unread_parameter_model,
)
from tests.ranks_fsdp import refused_messages_rank

CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.05)  # 41 samples: 6 steps
STEPS = 6
TIMEOUT = 240.0  # the machine may be shared; a hang fails instead of waiting
HARD_CASES = cases_for("fsdp")
STEP_REFUSALS = [(c, r) for c, r in refusals_for("fsdp") if r.when == "step"]
REFUSAL_OPTIONS = ({"depth": 0}, {"depth": 2, "reshard_after_forward": False})
UNREAD_SAMPLES = 36  # every rank of 2 or 3 gets as many: the mean of means is exact
MLP_SIZES = (6, 16, 16, 16, 16, 3)  # 5 units of 112, 272, 272, 272, 51
SETTINGS = {  # name: FSDPByHand options, on the MLP in float32
    "depth 0": {"depth": 0, "record": True},  # a timeline: nothing hidden
    "depth 1": {"depth": 1},
    "depth 2": {"depth": 2},
    "kept gathered": {"depth": 1, "reshard_after_forward": False},
    "bf16 depth 1": {"depth": 1, "param_dtype": torch.bfloat16},
}

CAST_NUMEL = 13  # numbers the casts are run on: unequal chunks on 2 and 3 ranks
STACK_SIZE = (4, 6)  # 4 residual blocks of width 6: 4 units of 318
STACK_SETTINGS = {"none": (0, 1), "every block": (1, 1), "segments of 2": (1, 2)}


def mlp(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return make_mlp(MLP_SIZES, dtype=dtype)


def per_rank(builder, dtype, world_size):
    """Every rank's own model, from ``seed + rank``: only rank 0's is the start."""
    return [builder(dtype, seed=rank) for rank in range(world_size)]


@pytest.fixture(scope="package", params=[2, 3], ids=lambda n: f"world{n}")
def fsdp_runs(request):
    """(world_size, {key: each rank's history}, each rank's (refusal messages,
    report of the lesson's casts))."""
    world_size = request.param
    keys, runs = [], []
    for dtype in DTYPES:
        X, y = hard_case_data(dtype=dtype)
        for case in HARD_CASES:
            keys.append((case.name, dtype))
            runs.append((per_rank(case.build, dtype, world_size), X, y, CONFIG, {}))
    X, y = hard_case_data(dtype=torch.float32)
    for setting, options in SETTINGS.items():
        keys.append((setting, torch.float32))
        runs.append((per_rank(mlp, torch.float32, world_size), X, y, CONFIG, options))
    for name, (every, segment) in STACK_SETTINGS.items():
        torch.manual_seed(0)
        stack = make_block_stack(*STACK_SIZE, every, segment)
        keys.append(("stack", name))
        options = {"depth": 1, "count_activations": True}
        runs.append((stack, X, y, CONFIG, options))
    keys.append(("TiedFrozenNet bf16", torch.float32))
    bf16 = {"param_dtype": torch.bfloat16}
    model = per_rank(hard_case_model, torch.float32, world_size)
    runs.append((model, X, y, CONFIG, bf16))
    X36, y36 = hard_case_data(UNREAD_SAMPLES, dtype=torch.float64)
    unread = (unread_parameter_model(), X36, y36, CONFIG.lr)
    X64, y64 = hard_case_data(dtype=torch.float64)
    refusals = [  # refused in the step where the ranks first differ
        (refused_rank, (fsdp_ranks.fsdp_runs_rank, [(models, X64, y64, CONFIG, o)]))
        for case, _ in STEP_REFUSALS
        for models in [per_rank(case.build, torch.float64, world_size)]
        for o in REFUSAL_OPTIONS
    ]
    calls = [
        (fsdp_ranks.fsdp_runs_rank, (runs,)),
        (fsdp_ranks.fsdp2_mixed_runs_rank, ([(model, X, y, CONFIG)],)),
        (refused_messages_rank, ()),
        (
            mixed_precision_exercise_rank,
            (gather_parameters, reduce_gradient, CAST_NUMEL),
        ),
        (unread_parameter_rank, unread),
        *refusals,
    ]
    results = spawn(in_one_launch, world_size, calls, timeout=TIMEOUT)
    histories = {key: [r[0][i] for r in results] for i, key in enumerate(keys)}
    histories["FSDP2 bf16"] = [r[1][0] for r in results]
    histories["unread parameter"] = [r[4] for r in results]
    pairs = [(c.name, o["depth"]) for c, _ in STEP_REFUSALS for o in REFUSAL_OPTIONS]
    for i, (name, depth) in enumerate(pairs):
        histories[("refused", name, depth)] = [r[5 + i] for r in results]
    return world_size, histories, [(r[2], r[3]) for r in results]
