"""The tensor-parallel block meets the hard cases (tests/hard_cases.py): it splits a
transformer block only, and refuses each case of the registry by name before any
rank sends anything (15)."""

import pytest

from multigpu.tensor_parallel import TensorParallelBlock
from tests.hard_cases import case_id, cases_for, refusals_for


def test_the_registry_has_no_case_the_block_splits():
    """Every case is refused below; a case the block can split (a transformer
    block) would need its equality run here, next to test_blocks.py's."""
    assert cases_for("tensor_parallel") == []


@pytest.mark.parametrize(
    ("case", "refusal"),
    refusals_for("tensor_parallel"),
    ids=case_id,
)
@pytest.mark.parametrize("world_size", [2, 4])
def test_each_hard_case_is_refused_by_name(case, refusal, world_size):
    with pytest.raises((TypeError, ValueError)) as error:
        TensorParallelBlock(case.build(), 0, world_size)
    message = str(error.value)
    assert refusal.words in message and "\n" not in message
