"""The hard-case registry (tests/hard_cases.py) meets context parallelism: its models
map (N, 6) samples to logits and hold no attention, so there is no sequence to split;
the block step refuses each of them by name, before any rank sends anything. The
hard cases that apply to a sequence model (float32 and float64, uneven and empty
shards, a frozen projection, ranks from different seeds) are the block steps of
problem.py, run on 1, 2 and 4 ranks in test_block.py."""

import pytest

from multigpu.context_parallel import cp_block_step
from tests.context_parallel.problem import block_steps
from tests.hard_cases import CASES, DTYPES, case_id, hard_case_data


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_registry_model_is_refused_by_name(case):
    X, y = hard_case_data()
    with pytest.raises(TypeError) as error:
        cp_block_step(case.build(), X[None], X[None], causal=True)
    message = str(error.value)
    assert f"got {type(case.build()).__name__}, which has no attention" in message
    assert "\n" not in message


def test_the_block_steps_cover_the_registrys_dtypes_and_traits():
    steps = block_steps().values()
    assert {step["x"].dtype for step in steps} == set(DTYPES)
    assert any(step["frozen"] for step in steps)  # a frozen parameter
    lengths = {step["x"].shape[1] for step in steps}
    assert 13 in lengths and 3 in lengths  # uneven on 2-4 ranks; empty on 4
