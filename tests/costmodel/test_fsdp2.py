"""Tests for multigpu.costmodel.fsdp2: values worked out by hand (the measured
counterparts are in tests/fsdp2/test_counting.py and test_sharding.py)."""

import pytest

from multigpu.costmodel.fsdp2 import (
    LLAMA3_8B,
    fsdp2_bytes_per_parameter,
    fsdp2_collectives_per_step,
    fsdp2_memory_per_rank,
    fsdp2_parameter_bytes_after_forward,
    llama_parameter_counts,
    shard_numel,
)


def test_llama3_8b_has_8_billion_parameters():
    counts = llama_parameter_counts(LLAMA3_8B)
    assert counts["total"] == 8_030_261_248  # the model card's 8.03B
    assert counts["block"] == 218_112_000
    assert counts["embeddings"] == 2 * 128256 * 4096


def test_shard_numel_pads_rows_as_torch_chunk_cuts_them():
    assert shard_numel((5, 32), 2) == 3 * 32  # rows 3 + 2, padded to 3
    assert shard_numel((3,), 4) == 1
    assert shard_numel((), 4) == 1  # a scalar: one number, not split


def test_parameter_bytes_after_forward_by_setting():
    units = [[(8, 6), (8,)], [(3, 8), (3,)]]  # shards on 4 ranks: 2*6+2, 1*8+1
    shard = (14 + 9) * 4
    assert fsdp2_parameter_bytes_after_forward(units, 4, True) == {
        "sharded": shard,
        "unsharded": 0,
        "post-forward": 0,
    }
    assert (
        fsdp2_parameter_bytes_after_forward(units, 4, False)["unsharded"] == 4 * shard
    )
    held = fsdp2_parameter_bytes_after_forward(units, 4, 2, compute_bytes=2)
    assert held == {
        "sharded": shard,
        "unsharded": 0,
        "post-forward": 4 * shard // 2 // 2,
    }


@pytest.mark.parametrize("bad", [1, 3, 4, 0])
def test_reshard_to_a_non_divisor_is_refused(bad):
    with pytest.raises(ValueError) as error:
        fsdp2_parameter_bytes_after_forward([[(4,)]], 4, bad)
    assert str(error.value) == (
        f"reshard_after_forward={bad} is not True, False or a divisor of the shard "
        "size 4 other than 1 and itself. Pass True, False or such a divisor (e.g. the "
        "GPUs per node)."
    )


def test_collectives_per_step():
    assert fsdp2_collectives_per_step(3) == {
        "all-gather": 6,
        "reduce-scatter": 3,
        "all-reduce": 0,
    }
    assert fsdp2_collectives_per_step(3, False)["all-gather"] == 3
    assert fsdp2_collectives_per_step(3, root_keeps_parameters=True)["all-gather"] == 5
    assert fsdp2_collectives_per_step(3, micro_batches=4)["all-gather"] == 24
    assert fsdp2_collectives_per_step(3, micro_batches=4)["reduce-scatter"] == 3
    assert fsdp2_collectives_per_step(3, replicas=2)["all-reduce"] == 3


def test_bytes_per_parameter_by_setting():
    assert fsdp2_bytes_per_parameter(8) == {
        "parameters": 0.5,
        "gradients": 0.5,
        "optimizer": 1.0,
        "held after forward": 0.0,
    }
    assert fsdp2_bytes_per_parameter(8, False)["held after forward"] == 2.0
    assert fsdp2_bytes_per_parameter(8, 4)["held after forward"] == 0.5
    assert (
        fsdp2_bytes_per_parameter(8, False, mixed_precision=False)["held after forward"]
        == 4.0
    )
    assert sum(fsdp2_bytes_per_parameter(1).values()) == 18.0  # DDP: 16 + bf16 copy


def test_memory_per_rank_adds_the_units_in_flight():
    ledger = fsdp2_memory_per_rank(1000, 100, 4, True, units_in_flight=2)
    assert ledger["parameters"] == 1000.0 and ledger["optimizer"] == 2000.0
    assert ledger["in flight"] == 2 * 100 * 2 + 100 * (2 + 4)


def test_accumulation_keeps_the_whole_models_gradients_on_every_rank():
    accumulating = fsdp2_bytes_per_parameter(8, accumulating=True)
    assert accumulating["unsharded gradients"] == 4.0  # fp32, not divided by 8
    assert sum(accumulating.values()) == 2.0 + 4.0
    assert "unsharded gradients" not in fsdp2_bytes_per_parameter(1, accumulating=True)


def test_ddp_buckets_copy_the_gradients_unless_they_are_views():
    assert (
        sum(fsdp2_bytes_per_parameter(1, gradient_as_bucket_view=False).values())
        == 22.0
    )
    assert "DDP buckets" not in fsdp2_bytes_per_parameter(
        8, gradient_as_bucket_view=False
    )


def test_explicit_true_reshards_the_root_too():
    default = fsdp2_collectives_per_step(35, True, root_keeps_parameters=True)
    explicit = fsdp2_collectives_per_step(35, True)
    assert (default["all-gather"], explicit["all-gather"]) == (69, 70)


def test_parameters_kept_between_micro_batches_skip_their_forward_all_gathers():
    kept = fsdp2_collectives_per_step(3, micro_batches=2, reshard_after_backward=False)
    assert kept["all-gather"] == 2 * (3 + 3) - 3
