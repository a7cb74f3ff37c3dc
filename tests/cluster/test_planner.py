"""Tests for multigpu.cluster.planner: every grid obeys the rules, every plan fits,
plans come fastest first, and a model too big for the GPUs has no plan."""

import pytest

from multigpu.cluster.llama import LLAMA3_8B, LLAMA3_70B
from multigpu.cluster.planner import plan_configurations, predicted_memory, valid_grids
from multigpu.core.sizes import GB
from multigpu.costmodel.fsdp2 import llama_parameter_counts


def test_every_grid_obeys_the_rules_and_none_is_missed():
    grids = valid_grids(LLAMA3_8B, 64, 32, 8192, 8)
    assert len(set(grids)) == len(grids)
    for dp, tp, pp, cp in grids:
        assert dp * tp * pp * cp == 64 and tp <= 8 and 8 % tp == 0
        assert 32 % pp == 0 and 32 % dp == 0 and cp <= 8
        assert pp == 1 or 32 // dp >= pp
    assert (2, 8, 4, 1) in grids and (1, 8, 8, 1) in grids  # 16, 32 micro-batches
    assert (64, 1, 1, 1) not in grids  # 32 sequences cannot go to 64 replicas
    assert (8, 1, 8, 1) not in grids  # 4 micro-batches for 8 stages
    assert (4, 16, 1, 1) not in grids  # tp leaves the node


def test_the_state_part_is_16_bytes_per_parameter_over_all_gpus():
    total = llama_parameter_counts(LLAMA3_70B.as_dict())["total"]
    memory = predicted_memory(LLAMA3_70B, 16, 4, 2, 2, 8192, 8)
    assert memory["state"] == pytest.approx(16 * total / 256)


def test_plans_fit_and_come_fastest_first():
    plans = plan_configurations(LLAMA3_70B, 80 * GB, 256, 512, 8192)
    assert plans
    assert all(plan.memory_total <= 80 * GB for plan in plans)
    seconds = [plan.step_seconds for plan in plans]
    assert seconds == sorted(seconds)


def test_seventy_billion_parameters_fit_sixteen_gpus_only_with_recomputation():
    # Adam's fp32 state alone is 16 bytes x 70.6e9 / 8 = 141 GB a GPU on 8 GPUs,
    # 70.6 GB on 16: what is left holds activations only if they are recomputed
    assert plan_configurations(LLAMA3_70B, 80 * GB, 8, 64, 8192) == []
    plans = plan_configurations(LLAMA3_70B, 80 * GB, 16, 64, 8192)
    assert plans and all(plan.recompute for plan in plans)


def test_bad_inputs_are_refused_in_one_line():
    with pytest.raises(ValueError, match="gpus must be an integer"):
        valid_grids(LLAMA3_8B, 0, 32, 8192)
