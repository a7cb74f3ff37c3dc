"""Tests for multigpu.costmodel.zero_stages: the ZeRO stages' memory and traffic
(13)."""

import pytest

from multigpu import costmodel


def test_zero_formulas_worked_out_by_hand():
    per_parameter = costmodel.zero_bytes_per_parameter
    assert sum(per_parameter("DDP", 8).values()) == 16  # 4 + 4 + 8
    assert sum(per_parameter("ZeRO-1", 4).values()) == 10  # 4 + 4 + 8/4
    assert sum(per_parameter("ZeRO-2", 4).values()) == 7  # 4 + 12/4
    assert sum(per_parameter("ZeRO-3", 4).values()) == 4  # 16/4
    assert sum(per_parameter("DDP", 64, "mixed").values()) == 16  # 2 + 2 + 12
    assert sum(per_parameter("ZeRO-3", 8, "mixed").values()) == 2  # 16/8
    # The paper's example: 7.5B parameters, 64 GPUs, mixed precision.
    gigabytes = {
        stage: round(
            sum(costmodel.zero_memory_ledger(stage, 64, 7.5e9, "mixed").values()) / 1e9,
            2,
        )
        for stage in costmodel.ZERO_STAGES
    }
    assert gigabytes == {"DDP": 120.0, "ZeRO-1": 31.41, "ZeRO-2": 16.64, "ZeRO-3": 1.88}
    float64 = costmodel.zero_memory_ledger("DDP", 1, 10, element_size=8)
    assert sum(float64.values()) == 320
    assert costmodel.zero_bytes_sent_theory("DDP", 100, 4) == 150  # 2 * 3/4 * 100
    assert costmodel.zero_bytes_sent_theory("ZeRO-3", 100, 4) == 225  # 3 * 3/4 * 100
    assert costmodel.zero_bytes_sent_theory("ZeRO-2", 100, 1) == 0


def test_zero_exact_bytes_average_the_theory_when_shards_are_equal():
    # 40 parameters in layers of 20: 4 ranks cut the buffer and each layer evenly.
    for stage in costmodel.ZERO_STAGES:
        exact = [
            costmodel.zero_bytes_sent_per_rank(stage, [20, 20], 4, 4, rank)
            for rank in range(4)
        ]
        assert exact == [costmodel.zero_bytes_sent_theory(stage, 160, 4)] * 4
    # 10 parameters over 4 ranks: DDP sends a ring all-reduce, ZeRO-2 its halves.
    ddp = [costmodel.zero_bytes_sent_per_rank("DDP", [10], 4, 4, r) for r in range(4)]
    zero2 = [
        costmodel.zero_bytes_sent_per_rank("ZeRO-2", [10], 4, 4, r) for r in range(4)
    ]
    assert ddp == [costmodel.ring_bytes_per_rank(10, 4, 4, r) for r in range(4)]
    assert zero2 == [56, 60, 64, 60]  # rank 0: 28 + 28, rank 1: 28 + 32, ...


def test_zero_formulas_say_how_to_fix_bad_arguments():
    with pytest.raises(ValueError) as error:
        costmodel.zero_bytes_per_parameter("zero3", 4)
    assert str(error.value) == (
        "Unknown stage 'zero3'. Choose one of: DDP, ZeRO-1, ZeRO-2, ZeRO-3."
    )
    with pytest.raises(ValueError) as error:
        costmodel.zero_memory_ledger("DDP", 4, 10, precision="bf16")
    assert str(error.value) == "Unknown precision 'bf16'. Choose one of: fp32, mixed."
    with pytest.raises(ValueError, match="^world_size must be an integer of at least"):
        costmodel.zero_bytes_sent_theory("DDP", 100, 0)
