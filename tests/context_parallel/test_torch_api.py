"""PyTorch's context_parallel on 2 CPU ranks (torch 2.14.1): its default SDPA fails
for want of a sharding strategy; with the math backend, non-causal attention equals
one process, computed by all-gathering the keys and values; causal attention (which
needs implicit_replication) is right only when the sequence is not reordered
head-tail. The buffers are sharded in the zig-zag order."""

import torch

from multigpu.context_parallel import reference_attention
from tests.context_parallel.conftest import TORCH_RUNS


def _runs(launched):
    world_size, results = launched
    return world_size, results["torch"]


def test_the_default_backend_fails_on_cpu(launched):
    world_size, runs = _runs(launched)
    if world_size != 2:
        assert runs == {}
        return
    for result in runs["default"]:
        assert result == {
            "error": "NotImplementedError: Operator "
            "aten._scaled_dot_product_flash_attention_for_cpu.default does not have "
            "a sharding strategy registered."
        }


def test_the_math_backend_runs_and_what_it_gets(launched):
    world_size, runs = _runs(launched)
    if world_size != 2:
        return
    cases = {name: case for name, case, _ in TORCH_RUNS}
    verdicts = {}
    for name in ("math", "math causal, head-tail", "math causal, no head-tail"):
        case = cases[name]
        reference = reference_attention(case.q, case.k, case.v, case.causal)
        differences = [(r["out"] - reference).abs().max().item() for r in runs[name]]
        verdicts[name] = all(d < 1e-12 for d in differences)
        for result in runs[name]:
            assert result["collectives"] == {
                "c10d_functional.all_gather_into_tensor": 2
            }  # the keys and the values gathered whole, not a ring
    assert verdicts == {
        "math": True,
        "math causal, head-tail": False,  # the mask is built for the original order
        "math causal, no head-tail": True,
    }
    assert [r["positions"] for r in runs["math"]] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [r["positions"] for r in runs["math causal, no head-tail"]] == [
        [0, 1, 2], [3, 4, 5]
    ]  # fmt: skip
    assert torch.is_tensor(runs["math"][0]["out"])
