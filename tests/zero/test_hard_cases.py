"""Every stage of multigpu.zero (DDP, ZeRO-1, -2, -3 by hand) and FSDP2 trains like
one process on the hard cases of tests/hard_cases.py that the registry gives it
(float64 and float32, on 2, 3 and 4 ranks whose models start from ``seed + rank``:
rank 0's weights are broadcast), and refuses by name the ones it says it cannot
take: DDP, ZeRO-1 and ZeRO-2 a parameter that gets a gradient in some steps only
(its missing gradient counted as zeros would move it), ZeRO-3 a tied weight and
parameters outside nn.Linear. ZeRO-3 trains the tied model once it is untied."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from multigpu import zero
from multigpu.core.train import TrainConfig
from multigpu.ranks import zero as zero_ranks
from multigpu.runtime.launch import WorkerError, in_one_launch, spawn
from tests.hard_cases import (
    BY_NAME,
    DTYPES,
    assert_kept,
    case_id,
    cases_for,
    hard_case_data,
    hard_case_model,
    never_gradient_numel,
    refusals_for,
    refused_rank,
    tiny_model,
    trainable_numel,
)

CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.05)  # 41 samples: 3 steps/epoch
STEPS = 6
TIMEOUT = 180.0  # the machine may be shared; a hang fails instead of waiting forever
# float64: the ranks add in another order (~1e-16); float32 likewise, ~1e-7 measured
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}
FLAT_STAGES = ("DDP", "ZeRO-1", "ZeRO-2")
WRAPPER = {"DDP": "zero", "ZeRO-1": "zero", "ZeRO-2": "zero", "ZeRO-3": "zero-3"}


def untied_model(dtype=torch.float64, seed=0):
    """TiedFrozenNet with its tie cut (decode gets a copy): what ZeRO-3 can shard."""
    model = hard_case_model(dtype, seed)
    model.decode.weight = nn.Parameter(model.encode.weight.detach().clone())
    return model


def per_rank_models(build, dtype, world_size):
    """Every rank's own model, from ``seed + rank``: only rank 0's is the start."""
    return [build(dtype, seed=rank) for rank in range(world_size)]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def hard_runs(request):
    """(world_size, {(stage, case name, dtype): each rank's ShardedHistory, and
    ("refused", stage, case name): each rank's refusal}), in one launch."""
    world_size = request.param
    keys, runs, fsdp2_keys, fsdp2_runs = [], [], [], []
    for dtype in DTYPES:
        X, y = hard_case_data(dtype=dtype)
        for stage, wrapper in WRAPPER.items():
            for case in cases_for(wrapper):
                keys.append((stage, case.name, dtype))
                models = per_rank_models(case.build, dtype, world_size)
                runs.append((stage, models, X, y, CONFIG))
        if dtype == torch.float64:  # what the refusal says to do: untie them
            keys.append(("untied", "ZeRO-3", dtype))
            models = per_rank_models(untied_model, dtype, world_size)
            runs.append(("ZeRO-3", models, X, y, CONFIG))
        for case in cases_for("fsdp2") if dtype == torch.float64 else ():
            fsdp2_keys.append(("FSDP2", case.name, dtype))  # float32: tests/fsdp2
            models = per_rank_models(case.build, dtype, world_size)
            fsdp2_runs.append((models, X, y, CONFIG))
    X, y = hard_case_data()
    refused_keys, calls = [], []
    refused = [
        (stage, case) for stage in FLAT_STAGES for case, _ in refusals_for("zero")
    ]
    refused += [("ZeRO-3", case) for case, _ in step_refusals("zero-3")]
    for stage, case in refused:
        refused_keys.append(("refused", stage, case.name))
        models = per_rank_models(case.build, torch.float64, world_size)
        run = (zero_ranks.stages_rank, [(stage, models, X, y, CONFIG)])
        calls.append((refused_rank, run))
    calls = [
        (zero_ranks.stages_rank, (runs,)),
        (zero_ranks.fsdp2_runs_rank, (fsdp2_runs,)),
        *calls,
    ]
    per_rank = spawn(in_one_launch, world_size, calls, timeout=TIMEOUT)
    results = {key: [r[0][i] for r in per_rank] for i, key in enumerate(keys)}
    results |= {key: [r[1][i] for r in per_rank] for i, key in enumerate(fsdp2_keys)}
    for i, key in enumerate(refused_keys):
        results[key] = [r[2 + i] for r in per_rank]
    return world_size, results


def largest_difference(result, reference):
    return max((result[name] - reference[name]).abs().max().item() for name in result)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_stage_and_fsdp2_train_like_one_process_on_the_hard_cases(
    hard_runs, dtype
):
    world_size, results = hard_runs
    X, y = hard_case_data(dtype=dtype)
    for key, histories in results.items():
        if key[0] in ("refused", "untied") or key[2] != dtype:
            continue
        stage, name, _ = key
        case = BY_NAME[name]
        start = case.build(dtype, seed=0)
        reference = zero.train_one_process_adam(start, X, y, CONFIG)
        moved = largest_difference(reference.parameters, start.state_dict())
        assert moved > 100 * TOLERANCE[dtype]  # training did move the weights
        assert len(histories) == world_size
        for history in histories:
            assert len(history.step_loss) == STEPS, key
            # FSDP2 names each parameter once (no buffer, no tied alias)
            expected = {n for n, _ in start.named_parameters()}
            assert expected <= history.parameters.keys(), key
            difference = largest_difference(history.parameters, reference.parameters)
            assert difference <= TOLERANCE[dtype], (key, difference)
            assert_kept(case, start.state_dict(), history.parameters, key)
        if stage != "FSDP2":  # the mean of the ranks' losses is one process's
            losses = torch.tensor([h.step_loss for h in histories], dtype=dtype)
            expected_losses = torch.tensor(reference.step_loss, dtype=dtype)
            assert_close(
                losses.mean(0), expected_losses, rtol=0, atol=100 * TOLERANCE[dtype]
            )


def test_frozen_parameters_are_kept_out_of_the_optimizers_shards(hard_runs):
    world_size, results = hard_runs
    dtype = torch.float64
    for stage, wrapper in WRAPPER.items():
        for case in cases_for(wrapper):
            model = case.build(dtype)
            held = sum(
                r.ledger["optimizer"] for r in results[(stage, case.name, dtype)]
            )
            copies = world_size if stage == "DDP" else 1  # DDP: a whole copy per rank
            trainable = trainable_numel(model)
            if stage == "ZeRO-3":  # no Adam state for a layer that got no gradient
                trainable -= never_gradient_numel(case, model)
            assert held == copies * 2 * trainable * 8, (stage, case.name)  # moments


def test_the_flat_stages_refuse_a_parameter_that_misses_some_steps(hard_runs):
    """On every rank at once, naming the parameters and the steps."""
    _, results = hard_runs
    for stage in FLAT_STAGES:
        for case, refusal in refusals_for("zero"):
            for result in results[("refused", stage, case.name)]:
                assert "result" not in result, (stage, case.name)
                message = result["refused"]
                assert message.startswith(f"ValueError: {stage} by hand counts a")
                assert refusal.words in message and "\n" not in message


def step_refusals(wrapper):
    """The cases ``wrapper`` refuses in the step where the ranks first differ."""
    return [(c, r) for c, r in refusals_for(wrapper) if r.when == "step"]


def test_zero3_refuses_a_layer_some_ranks_skip_on_every_rank_in_that_step(hard_runs):
    """The ranks compare which layer they move before each collective: a layer some
    batches skip is named on every rank at once, none left waiting."""
    _, results = hard_runs
    assert step_refusals("zero-3"), "the registry has a case ZeRO-3 refuses in a step"
    for case, refusal in step_refusals("zero-3"):
        messages = [
            r.get("refused", "") for r in results[("refused", "ZeRO-3", case.name)]
        ]
        assert all(
            m.startswith("ValueError: ZeRO-3 by hand: the ranks are") for m in messages
        )
        assert all(refusal.words in m and "\n" not in m for m in messages), messages
        assert len(set(messages)) == 1  # the same words on every rank


@pytest.mark.parametrize(
    ("case", "refusal"),
    [(c, r) for c, r in refusals_for("zero-3") if r.when == "start"],
    ids=case_id,
)
def test_zero3_refuses_what_it_cannot_shard_before_anything_is_sent(case, refusal):
    model = case.build()
    with pytest.raises(ValueError) as error:
        zero.check_shardable(model)  # what train_stage asks first, on every rank
        zero.shard_model(model, zero.Meter())
    assert refusal.words in str(error.value) and "\n" not in str(error.value)


def test_zero3_trains_the_tied_model_once_untied(hard_runs):
    _, results = hard_runs
    dtype = torch.float64
    X, y = hard_case_data(dtype=dtype)
    start = untied_model(dtype)
    reference = zero.train_one_process_adam(start, X, y, CONFIG)
    for history in results[("untied", "ZeRO-3", dtype)]:
        difference = largest_difference(history.parameters, reference.parameters)
        assert difference <= TOLERANCE[dtype], difference
        assert torch.equal(history.parameters["frozen.weight"], start.frozen.weight)
        assert torch.equal(history.parameters["unused.weight"], start.unused.weight)


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
