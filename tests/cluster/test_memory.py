"""Tests for multigpu.cluster.memory and multigpu.costmodel.cluster's memory and
collective formulas: PyTorch's memory tracker and CommDebugMode on rank 0 of a
fake (128, 8) mesh of 1,024 ranks, for Llama-3-8B- and 70B-shaped blocks, give
the formulas' bytes and counts exactly; one more block adds the census of one
block."""

import dataclasses

import pytest

from multigpu.cluster.llama import LLAMA3_8B, LLAMA3_70B
from multigpu.cluster.memory import (
    measure_llama,
    saved_in_one_block,
    tool_against_formula,
)
from multigpu.costmodel.cluster import (
    fsdp_tp_collectives_per_step,
    llama_activation_bytes,
    llama_block_activation_bytes,
    llama_state_bytes,
)

SEQ = 512


@pytest.fixture(scope="module")
def eight_b():
    return {
        layers: measure_llama(LLAMA3_8B, 128, 8, SEQ, layers=layers)
        for layers in (1, 2)
    }


def test_the_tracker_after_forward_equals_the_formulas(eight_b):
    shape = dataclasses.replace(LLAMA3_8B, layers=2)
    tool, state = eight_b[2]["after forward"], llama_state_bytes(shape, 128, 8)
    assert tool["Sharded Param"] == state["sharded"]
    assert tool["Unsharded Param"] == state["root whole"]
    assert tool["Activation"] == llama_activation_bytes(shape, 8, SEQ)


def test_the_tracker_after_the_step_equals_the_formulas(eight_b):
    state = llama_state_bytes(dataclasses.replace(LLAMA3_8B, layers=2), 128, 8)
    after = eight_b[2]["after step"]
    assert after["Sharded Grad"] == state["gradients"]
    assert after["OptState"] == state["optimizer"]


def test_one_more_block_adds_one_blocks_census(eight_b):
    more = (
        eight_b[2]["after forward"]["Activation"]
        - eight_b[1]["after forward"]["Activation"]
    )
    census = llama_block_activation_bytes(LLAMA3_8B, 8, SEQ)
    assert more == sum(census.values())
    saved = saved_in_one_block(LLAMA3_8B, 128, 8, SEQ)
    assert sum(nbytes for _, _, nbytes in saved) == more


def test_collectives_per_step_equal_the_formula(eight_b):
    for layers, found in eight_b.items():
        assert found["collectives"] == fsdp_tp_collectives_per_step(layers, 128, 8)


def test_the_70b_shape_on_a_4096_rank_mesh_equals_the_formulas():
    found = measure_llama(LLAMA3_70B, 512, 8, SEQ, layers=1)
    shape = dataclasses.replace(LLAMA3_70B, layers=1)
    state = llama_state_bytes(shape, 512, 8)
    assert found["after forward"]["Sharded Param"] == state["sharded"]
    assert found["after forward"]["Unsharded Param"] == state["root whole"]
    assert found["after forward"]["Activation"] == llama_activation_bytes(shape, 8, SEQ)
    assert found["after step"]["OptState"] == state["optimizer"]
    assert found["collectives"] == fsdp_tp_collectives_per_step(1, 512, 8)


def test_tool_against_formula_pairs_every_kind_with_its_formula(eight_b):
    shape = dataclasses.replace(LLAMA3_8B, layers=2)
    rows = tool_against_formula(eight_b[2], shape, 128, 8, SEQ)
    assert len(rows) == 5
    assert rows[0][1] == eight_b[2]["after forward"]["Sharded Param"]
    assert rows[-1][1] == eight_b[2]["after step"]["OptState"]
    assert rows[0][2] == llama_state_bytes(shape, 128, 8)["sharded"]
    assert all(found == formula for _, found, formula in rows)
