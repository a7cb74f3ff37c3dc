"""One launch per world size (1, 2, 4) runs every rank function of notebook 17 on
the shared cases: attention forward and backward (ring and Ulysses), block steps,
the memory steps, the short ring, the labelled all-to-all and, on 2 ranks,
PyTorch's context_parallel."""

import pytest

from multigpu.context_parallel import make_attention_case, merge_attention_results
from multigpu.ranks import context_parallel as cp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.context_parallel.problem import (
    ALL_TO_ALL_HEADS,
    ALL_TO_ALL_TOKENS,
    TIMEOUT,
    attention_cases,
    block_steps,
    memory_steps,
    simple_ring_cases,
)

# on 2 ranks: (name, case, SDPA backend); head-tail order needs 2·n | seq
TORCH_RUNS = (
    ("default", make_attention_case(8, causal=True), "default"),
    ("math", make_attention_case(8, causal=False), "math"),
    ("math causal, head-tail", make_attention_case(8, causal=True), "math"),
    ("math causal, no head-tail", make_attention_case(6, causal=True), "math"),
)


@pytest.fixture(scope="package", params=[1, 2, 4], ids=lambda n: f"world{n}")
def launched(request):
    """(world_size, {"cases": {key: AttentionCase}, "attention": {key:
    AttentionRun}, "blocks": {name: each rank's result}, "memory": {seq_len: each
    rank's result}, "simple": [(case, each rank's output)], "all_to_all": each
    rank's tables, "torch": {name: each rank's result}})."""
    world_size = request.param
    cases, steps, memory = attention_cases(world_size), block_steps(), memory_steps()
    simple = simple_ring_cases()
    calls = [
        (cp_ranks.attention_rank, (list(cases.values()),)),
        (cp_ranks.block_rank, (list(steps.values()),)),
        (cp_ranks.block_rank, (list(memory.values()),)),
        (cp_ranks.simple_ring_rank, (simple,)),
        (cp_ranks.all_to_all_rank, (ALL_TO_ALL_TOKENS, ALL_TO_ALL_HEADS)),
    ]
    if world_size == 2:
        calls += [
            (cp_ranks.torch_context_parallel_rank, (case, backend, True))
            for _, case, backend in TORCH_RUNS
        ]
    per_rank = spawn(in_one_launch, world_size, calls, timeout=TIMEOUT)
    attention = {
        key: merge_attention_results(case, [ranks[0][i] for ranks in per_rank])
        for i, (key, case) in enumerate(cases.items())
    }
    results = {
        "cases": cases,
        "attention": attention,
        "blocks": {
            name: [ranks[1][i] for ranks in per_rank] for i, name in enumerate(steps)
        },
        "memory": {
            seq: [ranks[2][i] for ranks in per_rank] for i, seq in enumerate(memory)
        },
        "simple": [
            (case, [ranks[3][i] for ranks in per_rank]) for i, case in enumerate(simple)
        ],
        "all_to_all": [ranks[4] for ranks in per_rank],
        "torch": {
            name: [ranks[5 + i] for ranks in per_rank]
            for i, (name, _, _) in enumerate(TORCH_RUNS if world_size == 2 else ())
        },
    }
    return world_size, results
