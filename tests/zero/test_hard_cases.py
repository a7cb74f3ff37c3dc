"""Every stage of multigpu.zero (DDP, ZeRO-1, -2, -3 by hand) and FSDP2 trains like
one process on the hard cases of tests/hard_cases.py: a tied weight, a frozen
parameter, an unused parameter, a buffer, counts no world size divides, fewer
parameters than ranks, 41 samples, float64 and float32, on 2, 3 and 4 ranks whose
models start from ``seed + rank`` (rank 0's weights are broadcast). ZeRO-3 by hand
refuses what it cannot shard (a tied weight, parameters outside nn.Linear), by name;
it trains the same model untied."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from multigpu import zero
from multigpu.core.train import TrainConfig
from multigpu.ranks import zero as zero_ranks
from multigpu.runtime.launch import WorkerError, spawn
from tests.hard_cases import (
    DTYPES,
    hard_case_data,
    hard_case_model,
    tiny_model,
    trainable_numel,
)

CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.05)  # 41 samples: 3 steps/epoch
STEPS = 6
TIMEOUT = 180.0  # the machine may be shared; a hang fails instead of waiting forever
# float64: the ranks add in another order (~1e-16); float32 likewise, ~1e-7 measured
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
FLAT_STAGES = ("DDP", "ZeRO-1", "ZeRO-2")


def untied_model(dtype=torch.float64, seed=0):
    """HardCaseNet with its tie cut (decode gets a copy): what ZeRO-3 can shard."""
    model = hard_case_model(dtype, seed)
    model.decode.weight = nn.Parameter(model.encode.weight.detach().clone())
    return model


BUILDERS = {
    "HardCaseNet": hard_case_model,
    "untied": untied_model,
    "TinyNet": tiny_model,
}
# (stage, model) pairs trained by hand; FSDP2 trains HardCaseNet and TinyNet
CASES = [(stage, "HardCaseNet") for stage in FLAT_STAGES]
CASES += [("ZeRO-3", "untied")] + [(stage, "TinyNet") for stage in FLAT_STAGES]


def per_rank_models(name, dtype, world_size):
    """Every rank's own model, from ``seed + rank``: only rank 0's is the start."""
    return [BUILDERS[name](dtype, seed=rank) for rank in range(world_size)]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def hard_runs(request):
    """(world_size, {(stage, model name, dtype): each rank's ShardedHistory}): every
    case trained in one launch for the stages and one for FSDP2."""
    world_size = request.param
    keys, runs, fsdp2_keys, fsdp2_runs = [], [], [], []
    for dtype in DTYPES:
        X, y = hard_case_data(dtype=dtype)
        for stage, name in CASES:
            keys.append((stage, name, dtype))
            runs.append((stage, per_rank_models(name, dtype, world_size), X, y, CONFIG))
        for name in ("HardCaseNet", "TinyNet"):
            fsdp2_keys.append(("FSDP2", name, dtype))
            fsdp2_runs.append((per_rank_models(name, dtype, world_size), X, y, CONFIG))
    stages = spawn(zero_ranks.stages_rank, world_size, runs, timeout=TIMEOUT)
    fsdp2 = spawn(zero_ranks.fsdp2_runs_rank, world_size, fsdp2_runs, timeout=TIMEOUT)
    results = {key: [r[i] for r in stages] for i, key in enumerate(keys)}
    results |= {key: [r[i] for r in fsdp2] for i, key in enumerate(fsdp2_keys)}
    return world_size, results


def largest_difference(result, reference):
    return max((result[name] - reference[name]).abs().max().item() for name in result)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_stage_and_fsdp2_train_like_one_process_on_the_hard_cases(
    hard_runs, dtype
):
    world_size, results = hard_runs
    X, y = hard_case_data(dtype=dtype)
    for (stage, name, key_dtype), histories in results.items():
        if key_dtype != dtype:
            continue
        start = BUILDERS[name](dtype, seed=0)  # rank 0's model
        reference = zero.train_single_process_adam(start, X, y, CONFIG)
        moved = largest_difference(reference.parameters, start.state_dict())
        assert moved > 100 * TOLERANCE[dtype]  # training did move the weights
        assert len(histories) == world_size
        for history in histories:
            assert len(history.step_loss) == STEPS, (stage, name)
            # FSDP2 names each parameter once (no buffer, no tied alias)
            expected = {n for n, _ in start.named_parameters()}
            assert expected <= history.parameters.keys(), (stage, name)
            difference = largest_difference(history.parameters, reference.parameters)
            assert difference <= TOLERANCE[dtype], (stage, name, difference)
            if name != "TinyNet":  # the frozen layer did not move, bit for bit
                assert torch.equal(
                    history.parameters["frozen.weight"], start.frozen.weight
                )
        if stage != "FSDP2":  # the mean of the ranks' losses is one process's
            losses = torch.tensor([h.step_loss for h in histories], dtype=dtype)
            expected_losses = torch.tensor(reference.step_loss, dtype=dtype)
            assert_close(
                losses.mean(0), expected_losses, rtol=0, atol=100 * TOLERANCE[dtype]
            )


def test_frozen_parameters_are_kept_out_of_the_optimizers_shards(hard_runs):
    world_size, results = hard_runs
    dtype = torch.float64
    for stage, name in CASES:
        model = BUILDERS[name](dtype)
        held = sum(r.ledger["optimizer"] for r in results[(stage, name, dtype)])
        copies = world_size if stage == "DDP" else 1  # DDP: a whole copy per rank
        trainable = trainable_numel(model)
        if stage == "ZeRO-3":  # Adam holds no state for a layer that got no gradient
            trainable -= sum(p.numel() for p in model.unused.parameters())
        assert held == copies * 2 * trainable * 8, (stage, name)  # float64 moments


def test_zero3_refuses_a_tied_weight_by_name():
    with pytest.raises(ValueError) as error:
        zero.check_shardable(hard_case_model())
    assert str(error.value) == (
        "ZeRO-3 by hand cannot shard a weight tied between two layers (encode.weight "
        "is decode.weight): each ShardedLinear keeps its own chunk. Untie them, or "
        "train with DDP, ZeRO-1 or ZeRO-2, which keep tied weights tied."
    )


def test_zero3_refuses_parameters_outside_a_linear_by_name():
    with pytest.raises(ValueError) as error:
        zero.shard_model(tiny_model(), zero.Meter())
    assert str(error.value) == (
        "Layer the model (TinyNet) has parameters that ZeRO-3 by hand cannot shard: "
        "it shards nn.Linear layers only. Build the model from nn.Linear layers, "
        "activations and buffers, e.g. with make_mlp(), or train it with DDP, ZeRO-1 "
        "or ZeRO-2."
    )


def test_zero3_refuses_a_half_frozen_layer_by_name():
    model = untied_model()
    model.head.bias.requires_grad_(False)
    with pytest.raises(ValueError) as error:
        zero.check_shardable(model)
    assert str(error.value) == (
        "Layer head (Linear) is half frozen (its weight and bias differ in "
        "requires_grad): ZeRO-3 by hand freezes or trains a whole layer. Freeze both "
        "or neither, e.g. layer.requires_grad_(False)."
    )


def test_zero3_refuses_on_every_rank_before_sending_anything():
    X, y = hard_case_data()
    with pytest.raises(WorkerError) as error:
        zero_ranks.compare_stages(
            hard_case_model(), X, y, CONFIG, 2, stages=["ZeRO-3"], timeout=TIMEOUT
        )
    assert "ValueError: ZeRO-3 by hand cannot shard a weight tied" in str(error.value)
    assert not error.value.timed_out  # refused, not left waiting for a peer
