"""The hand-built wrappers (multigpu.miniddp.wrappers) fail as clearly as PyTorch's
DDP on a parameter without a gradient, and with find_unused_parameters=True train
like it; on the hard cases they refuse what they cannot train, by name."""

import pytest
import torch

from multigpu import miniddp
from multigpu.core.compare import max_parameter_difference
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.hard_cases import hard_case_data, hard_case_model
from tests.ranks import miniddp_error_rank

TIMEOUT = 30.0


UNUSED_MESSAGE = (
    "2 parameter(s) received no gradient in this backward pass: head_b.weight, "
    "head_b.bias. Their gradients can never be all-reduced, so the other ranks "
    "would wait for them forever. Make every parameter take part in the loss, "
    "or pass find_unused_parameters=True (it costs a walk over the autograd "
    "graph after every forward and one more all-reduce)."
)


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
def test_a_parameter_without_gradient_is_an_error(strategy):
    results = spawn(miniddp_ranks.unused_rank, 2, strategy, False, timeout=TIMEOUT)
    for result in results:
        if strategy == "torch":  # DDP notices in the next forward
            assert (result["step"], result["error"]) == (1, "RuntimeError")
            assert "find_unused_parameters=True" in result["message"]
        else:  # ours at the end of the backward that missed it
            assert (result["step"], result["error"]) == (0, "UnusedParameterError")
            assert result["message"] == UNUSED_MESSAGE


@pytest.mark.parametrize("b_on_ranks", [(), (0,), (0, 1)], ids=["none", "rank0", "all"])
def test_find_unused_parameters_matches_torch_ddp(b_on_ranks):
    results = spawn(
        in_one_launch,
        2,
        [
            (miniddp_ranks.unused_rank, (s, True, b_on_ranks))
            for s in miniddp.STRATEGIES
        ],
        timeout=TIMEOUT,
    )[0]
    by_strategy = dict(zip(miniddp.STRATEGIES, results))
    theirs = by_strategy["torch"]["parameters"]
    for strategy in miniddp.STRATEGIES:
        ours = by_strategy[strategy]["parameters"]
        assert max_parameter_difference(ours, theirs) < 1e-12
    torch.manual_seed(0)  # the weights unused_rank starts from
    initial = miniddp.BranchNet().double()
    moved = not torch.equal(theirs["head_b.weight"], initial.head_b.weight.detach())
    assert moved == bool(b_on_ranks)


# ----------------------------------------------------------------------------------
# Hard cases the wrappers refuse, each by name (tests/hard_cases.py)

HARD_UNUSED_MESSAGE = (
    "2 parameter(s) received no gradient in this backward pass: unused.weight, "
    "unused.bias. Their gradients can never be all-reduced, so the other ranks "
    "would wait for them forever. Make every parameter take part in the loss, "
    "or pass find_unused_parameters=True (it costs a walk over the autograd "
    "graph after every forward and one more all-reduce)."
)
MIXED_DTYPES_MESSAGE = (
    "{wrapper} packs gradients into buffers of one dtype, but this model's "
    "parameters have 2 dtypes (float64: embed.weight, embed.bias, encode.weight, "
    "unused.weight, unused.bias; float32: head.weight, head.bias). Convert the "
    "model to one dtype (model.double() or model.float()), or use AfterBackwardDDP."
)
NOTHING_TO_TRAIN_MESSAGE = (
    "{wrapper} got a model with no parameter that requires a gradient, so there is "
    "nothing to all-reduce. Wrap a model with trainable parameters, or train this "
    "one without a wrapper."
)
WRAPPER_OF = {
    "after_backward": "AfterBackwardDDP",
    "flat": "FlatDDP",
    "bucketed": "BucketedDDP",
}


@pytest.fixture(scope="module")
def refusals():
    """{(case, strategy): what stopped training}, one launch of 2 ranks."""
    X, y = hard_case_data(8)
    mixed = hard_case_model()
    mixed.head.float()
    frozen = hard_case_model().requires_grad_(False)
    cases = {
        "unused": (hard_case_model(), miniddp.STRATEGIES),
        "mixed dtypes": (mixed, ("flat", "bucketed")),
        "nothing to train": (frozen, miniddp.STRATEGIES),
    }
    keys, calls = [], []
    for case, (model, strategies) in cases.items():
        for strategy in strategies:
            keys.append((case, strategy))
            calls.append((miniddp_error_rank, (model, strategy, {}, X, y)))
    per_rank = spawn(in_one_launch, 2, calls, timeout=60.0)
    for (_, strategy), first, second in zip(keys, *per_rank):  # ranks stop alike
        assert (first["step"], first["error"]) == (second["step"], second["error"])
        if strategy != "torch":  # DDP's message names the rank
            assert first["message"] == second["message"]
    return dict(zip(keys, per_rank[0]))


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
def test_an_unused_parameter_is_refused_by_name(refusals, strategy):
    result = refusals["unused", strategy]
    if strategy == "torch":  # DDP notices in the next forward
        assert (result["step"], result["error"]) == (1, "RuntimeError")
        assert "find_unused_parameters=True" in result["message"]
    else:
        assert (result["step"], result["error"]) == (0, "UnusedParameterError")
        assert result["message"] == HARD_UNUSED_MESSAGE


@pytest.mark.parametrize("strategy", ["flat", "bucketed"])
def test_parameters_of_several_dtypes_are_refused_by_the_buffered_wrappers(
    refusals, strategy
):
    result = refusals["mixed dtypes", strategy]
    assert (result["step"], result["error"]) == (-1, "TypeError")
    assert result["message"] == MIXED_DTYPES_MESSAGE.format(
        wrapper=WRAPPER_OF[strategy]
    )


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
def test_a_model_with_nothing_to_train_is_refused(refusals, strategy):
    result = refusals["nothing to train", strategy]
    expected = "RuntimeError" if strategy == "torch" else "ValueError"
    assert (result["step"], result["error"]) == (-1, expected)
    if strategy == "torch":
        assert (
            "doesn't have any parameter that requires a gradient" in (result["message"])
        )
    else:
        assert result["message"] == NOTHING_TO_TRAIN_MESSAGE.format(
            wrapper=WRAPPER_OF[strategy]
        )
