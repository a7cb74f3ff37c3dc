"""One launch per world size (1, 2, 4) runs every rank function of notebook 17 on
the shared cases: attention forward and backward (ring and Ulysses), block steps,
the memory steps and, on 2 ranks, PyTorch's context_parallel."""

import pytest

from multigpu.context_parallel import make_attention_case, merge_attention_results
from multigpu.ranks import context_parallel as cp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.context_parallel.problem import (
    TIMEOUT,
    attention_cases,
    block_steps,
    memory_steps,
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
    AttentionRun}, "blocks": {name: each
    rank's result}, "memory": {seq_len: each rank's result}, "torch": {name:
    each rank's result}})."""
    world_size = request.param
    cases, steps, memory = attention_cases(world_size), block_steps(), memory_steps()
    calls = [
        (cp_ranks.attention_rank, (list(cases.values()),)),
        (cp_ranks.block_rank, (list(steps.values()),)),
        (cp_ranks.block_rank, (list(memory.values()),)),
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
        "torch": {
            name: [ranks[3 + i] for ranks in per_rank]
            for i, (name, _, _) in enumerate(TORCH_RUNS if world_size == 2 else ())
        },
    }
    return world_size, results
