"""Tests for multigpu.ranks.cluster: FSDP2 x TP on 8 and 16 thread ranks of one
process equals one process (float64 to 1e-12, float32 to 1e-6) after three SGD
steps; the small GPT of 19 on two real processes, FSDP2 over 2 ranks and TP over 2
ranks, holds the bytes the formula gives and issues the collectives it counts."""

import pytest
import torch

from multigpu.costmodel.cluster import (
    fsdp_tp_collectives_per_step,
    tiny_gpt_state_bytes,
)
from multigpu.gpt4d.model import GPTConfig, make_gpt
from multigpu.ranks.cluster import fsdp_tp_difference, measure_small_gpt


@pytest.mark.parametrize("dp, tp", [(2, 4), (4, 4)])
def test_fsdp2_times_tp_on_thread_ranks_equals_one_process_float64(dp, tp):
    assert fsdp_tp_difference(dp, tp, torch.float64) < 1e-12


def test_fsdp2_times_tp_on_thread_ranks_equals_one_process_float32():
    assert fsdp_tp_difference(2, 2, torch.float32) < 1e-6


def test_the_small_gpt_measured_on_two_ranks_equals_the_formulas():
    config = GPTConfig(layers=2)
    grids = [(2, 1), (1, 2)]
    ranks = measure_small_gpt(make_gpt(config, torch.float32), grids)
    for found in ranks:
        for (dp, tp), measured in zip(grids, found, strict=True):
            collectives = measured.pop("collectives")
            assert measured == tiny_gpt_state_bytes(config, dp, tp)
            # 15's block plan: q, k, v and fc1 column-parallel; no root TP
            want = fsdp_tp_collectives_per_step(2, dp, tp, 4, root_parallel=False)
            assert collectives == want
