"""Tests for multigpu.fsdp2.loop (through the ranks of multigpu.ranks.fsdp2): FSDP2
trains like one process on every hard case the registry gives it, and under each
knob on TiedFrozenNet (ranks starting from seed + rank), float64 to 1e-12 and
float32 to 1e-5; accumulation equals one large batch; clipping equals clipping in
one process; bf16 mixed precision stays within a measured bound."""

import pytest
import torch

from multigpu import fsdp2
from tests.fsdp2.conftest import KNOB_CASE, TRAIN_RUNS
from tests.fsdp2.problem import BF16_BOUND, LR, MAX_NORM, TOLERANCE, global_steps
from tests.hard_cases import assert_kept


def distance(result, reference):
    return max(
        (result[name] - reference[name]).abs().max().item() for name in reference
    )


def reference_for(name):
    case, dtype, micro, knobs = TRAIN_RUNS[name]
    steps = global_steps(dtype, micro, steps=3 if micro == 1 else 2)
    max_norm = knobs.get("max_norm")
    start = case.build(dtype, seed=0)
    return fsdp2.train_one_process(start, steps, LR, max_norm), dtype


EXACT_RUNS = [name for name in TRAIN_RUNS if name != "mixed"]


@pytest.mark.parametrize("name", EXACT_RUNS)
def test_each_knob_trains_like_one_process_on_4_ranks(world4, name):
    reference, dtype = reference_for(name)
    case = TRAIN_RUNS[name][0]
    start = case.build(dtype, seed=0)
    moved = distance(reference.parameters, dict(start.named_parameters()))
    assert moved > 100 * TOLERANCE[dtype]  # training did move the weights
    for result in world4[name]:
        assert distance(result["parameters"], reference.parameters) <= TOLERANCE[dtype]
        assert_kept(case, start.state_dict(), result["parameters"], name)


@pytest.mark.parametrize("name", [KNOB_CASE.name, "accumulate", "clip"])
def test_each_knob_trains_like_one_process_on_2_ranks(world2, name):
    reference, dtype = reference_for(name)
    for result in world2[name]:
        assert distance(result["parameters"], reference.parameters) <= TOLERANCE[dtype]


def test_accumulation_equals_one_large_batch(world4):
    # 2 steps of 2 micro-batches of 12 = 2 steps of one batch of 24
    large = [
        [(torch.cat([m[0] for m in s]), torch.cat([m[1] for m in s]))]
        for s in global_steps(micro_batches=2, steps=2)
    ]
    reference = fsdp2.train_one_process(
        TRAIN_RUNS["accumulate"][0].build(torch.float64), large, LR
    )
    for result in world4["accumulate"]:
        assert distance(result["parameters"], reference.parameters) <= 1e-12


def test_clipping_dtensor_gradients_equals_clipping_in_one_process(world4, world2):
    reference, _ = reference_for("clip")
    assert all(norm > MAX_NORM for norm in reference.norms)  # clipping did clip
    assert reference.norm_types == ["Tensor"] * 3
    for result in world4["clip"] + world2["clip"]:
        assert len(result["norms"]) == 3
        assert result["norm types"] == ["DTensor"] * 3
        for norm, expected in zip(result["norms"], reference.norms):
            assert abs(norm - expected) <= 1e-12


def test_mixed_precision_stays_within_its_bound_of_one_process(world4, world2):
    reference, dtype = reference_for("mixed")
    assert dtype == torch.float32
    for result in world4["mixed"] + world2["mixed"]:
        difference = distance(result["parameters"], reference.parameters)
        assert 1e-5 < difference < BF16_BOUND  # really bf16, and still close
        assert result["all-gather dtypes"] == ["bfloat16"]  # cast, then gathered
        assert result["reduce-scatter dtypes"] == ["float32"]  # reduce_dtype
        assert all(v.dtype == torch.float32 for v in result["parameters"].values())


def test_train_steps_refuses_an_unknown_optimizer():
    with pytest.raises(ValueError) as error:
        fsdp2.make_optimizer(torch.nn.Linear(2, 2), 0.1, "lamb")
    assert (
        str(error.value)
        == "optimizer must be 'adam' or 'sgd', got 'lamb'. Pass one of them."
    )


def test_rank_part_is_tensor_split():
    X, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    parts = [fsdp2.rank_part((X, y), rank, 2) for rank in range(2)]
    assert [p[1].tolist() for p in parts] == [[0, 1, 2], [3, 4]]
