"""The cases the expert-parallel tests run on ranks: layers on 1, 2 and 4 ranks
(dropped tokens, an idle expert, a rank whose tokens all leave it, a rank with no
token, float32 and float64), and EP x DP trainings on the hard-case data (41
samples: no world size from 2 to 4 divides them)."""

from __future__ import annotations

import torch

from multigpu.expert_parallel import (
    EPDPCase,
    LayerCase,
    make_moe_classifier,
    random_layer_case,
    steered_layer_case,
)
from tests.hard_cases import hard_case_data

DIM, EXPERTS = 4, 4  # the layer cases' width and experts
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}
FROZEN = ("embed.0.bias", "moe.experts.1.fc1.weight")  # one dense, one expert's

# rank 1 of 2: every token to experts 0-1 (rank 0's); expert 2 gets nothing
LEAVING = ([0, 3, 3, 0, 1], [1, 0, 1])
# 4 ranks: rank 1 has no token, rank 2's all leave, expert 1 idle
EMPTY_SHARD = ([0, 3, 3, 2], [], [0, 0, 3], [2, 0])
# every rank sends each expert exactly 2 tokens (top-1): the balanced formula
BALANCED = tuple([0, 1, 2, 3, 3, 2, 1, 0] for _ in range(4))
F64, F32 = torch.float64, torch.float32


def layer_cases() -> list[LayerCase]:
    """Every layer case, each named "<ranks> ranks, <what>, <dtype>"."""
    cases = []
    for dtype, label in ((F64, "float64"), (F32, "float32")):
        for n in (1, 2, 4):
            sizes = [7, 5, 6, 4][:n]
            for top_k, factor in ((1, None), (2, 1.0), (1, 0.5)):
                name = f"{n} ranks, top-{top_k} cf {factor}, {label}"
                cases.append(random_layer_case(name, sizes, top_k, factor, dtype))
    cases += [
        steered_layer_case("2 ranks, rank 1's tokens all leave", LEAVING),
        steered_layer_case("2 ranks, same, top-2 cf 1.0", LEAVING, 2, 1.0),
        steered_layer_case("4 ranks, rank 1 empty, cf 1.0", EMPTY_SHARD, 1, 1.0),
        steered_layer_case("4 ranks, balanced", BALANCED),
        steered_layer_case("2 ranks on ranks 2-3", LEAVING, ranks=(2, 3)),
        random_layer_case("3 ranks (refused)", [3, 3, 3]),
    ]
    return cases


def ep_dp_cases() -> list[EPDPCase]:
    """EP x DP trainings on layouts of 2 and 4 ranks, from each rank's own seed:
    every layout in float64 with dropped tokens (capacity factor 1.0), two without
    a capacity, two in float32."""
    layouts = {  # name: (ranks, ep_size, samples per rank)
        "ep 2": ((0, 1), 2, [21, 20]),
        "ep 4": ((0, 1, 2, 3), 4, [11, 10, 10, 10]),
        "ep 2 x dp 2": ((0, 1, 2, 3), 2, [11, 10, 10, 10]),
        "dp 4 (ep 1)": ((0, 1, 2, 3), 1, [11, 10, 10, 10]),
        "ep 2 x dp 2, an empty shard": ((0, 1, 2, 3), 2, [20, 0, 11, 10]),
    }
    runs = [(name, 1.0, F64) for name in layouts]
    runs += [("ep 4", None, F64), ("ep 2 x dp 2", None, F64)]
    runs += [("ep 4", 1.0, F32), ("ep 2 x dp 2", 1.0, F32)]
    cases = []
    for name, factor, dtype in runs:
        ranks, ep, sizes = layouts[name]
        X, y = hard_case_data(dtype=dtype)
        models = [
            make_moe_classifier(
                dtype, seed=10 + i, top_k=2, capacity_factor=factor, frozen=FROZEN
            )
            for i in range(len(ranks))
        ]
        what = f"{name}, cf {factor}, {str(dtype)[6:]}"
        cases.append(EPDPCase(what, models, X, y, sizes, ranks, ep))
    return cases
