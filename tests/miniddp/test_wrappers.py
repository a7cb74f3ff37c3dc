"""The hand-built wrappers (multigpu.miniddp.wrappers) fail as clearly as PyTorch's
DDP on a parameter without a gradient, and with find_unused_parameters=True train
like it."""

import pytest
import torch

from multigpu import miniddp
from multigpu.core.compare import max_parameter_difference
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn

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
