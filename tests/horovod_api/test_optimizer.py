"""hvd.DistributedOptimizer trains exactly like PyTorch's DDP and like one process on
the global batch, with one fusion buffer or many and with backward_passes_per_step,
from ranks that start with different weights and with a parameter that only some
ranks use; its fusion buffers are laid out in advance and sent during backward, in
that order on every rank; and its mistakes are explained. The launches are in
conftest.py.
"""

import functools
import re
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from multigpu import horovod_api as hvd
from multigpu.allreduce_sgd import train_one_process as one_process
from multigpu.allreduce_sgd import world_losses
from multigpu.core.batches import run_batches
from multigpu.core.compare import max_parameter_difference
from multigpu.core.sizes import MiB
from multigpu.core.train import TrainConfig
from multigpu.horovod_api import optimizer as hvd_optimizer
from multigpu.ranks.horovod_api import train_horovod_style_rank as train
from multigpu.runtime.launch import in_one_launch, spawn
from tests.hard_cases import (
    DTYPES,
    REPLICATED_WORLD_SIZES,
    assert_ranks_equal_one_process,
    cases_for,
    hard_case_data,
    sometimes_unused_model,
)
from tests.horovod_api.problems import TINY_MB
from tests.ranks import horovod_from_own_seed_rank


@pytest.mark.parametrize("label", ["one fusion", "many fusions"])
def test_trains_like_torch_ddp_and_like_one_process(runs, reference, label):
    ours = runs[label][0]
    assert max_parameter_difference(ours.parameters, reference.parameters) < 1e-12
    torch_ddp = runs["torch"][0]
    assert max_parameter_difference(ours.parameters, torch_ddp.parameters) < 1e-12
    for other in runs[label][1:]:  # every rank ends with the same weights
        assert max_parameter_difference(other.parameters, ours.parameters) == 0
    losses = world_losses(runs[label])  # the mean over the ranks: the global batch's
    assert losses == pytest.approx(reference.step_loss, abs=1e-12)


def test_backward_passes_per_step_equals_no_sync_and_the_whole_batch(runs, reference):
    ours = runs["accumulated"][0]
    no_sync = runs["torch no_sync"][0]
    assert max_parameter_difference(ours.parameters, no_sync.parameters) < 1e-12
    assert max_parameter_difference(ours.parameters, reference.parameters) < 1e-12
    losses = world_losses(runs["accumulated"])
    assert losses == pytest.approx(reference.step_loss, abs=1e-12)
    for other in runs["accumulated"][1:]:
        assert max_parameter_difference(other.parameters, ours.parameters) == 0


def test_fusion_buffers_are_sent_during_backward_and_fit_the_threshold(runs, problem):
    model = problem[0]
    nbytes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    names = list(nbytes)
    for result in runs["fusion tiny"]:
        fusions = result["all"]
        assert sorted(n for fusion in fusions for n in fusion) == sorted(names)
        assert len(fusions) >= 3
        for fusion in fusions:  # several gradients share a buffer only if they fit
            if len(fusion) > 1:
                assert sum(nbytes[n] for n in fusion) <= TINY_MB * MiB
        assert any(len(fusion) > 1 for fusion in fusions)
        # Started in gradient hooks, while gradients were still to come:
        during = result["during_backward"]
        assert [fused for fused, _ in during] == fusions[: len(during)]
        assert len(during) >= 2
        assert during[0][1] > 0
        # The classifier's gradients come first, the first conv's last.
        assert "classifier.bias" in during[0][0]
        assert "features.0.weight" in fusions[-1]
    for result in runs["fusion default"]:
        assert result["during_backward"] == []  # everything fits: sent at step()
        assert [sorted(f) for f in result["all"]] == [sorted(names)]


def _backward(model):
    torch.manual_seed(1)
    model(torch.randn(4, 3, dtype=torch.float64)).square().sum().backward()


def test_backward_passes_that_do_not_match_are_errors(one_rank):
    model = torch.nn.Linear(3, 2).double()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(sgd, backward_passes_per_step=2)
    with pytest.raises(hvd.BackwardPassesError, match="without a backward pass"):
        optimizer.step()
    _backward(model)
    with pytest.raises(
        hvd.BackwardPassesError,
        match=re.escape(
            "came after 1 backward pass(es), but this DistributedOptimizer "
            "has backward_passes_per_step=2"
        ),
    ):
        optimizer.step()
    _backward(model)
    with pytest.raises(hvd.BackwardPassesError, match=r"zero_grad\(\) was called"):
        optimizer.zero_grad()
    with pytest.raises(hvd.BackwardPassesError, match="backward ran 3 times without"):
        _backward(model)


def test_accumulated_gradients_are_summed_then_averaged(one_rank):
    model = torch.nn.Linear(3, 2).double()
    alone = torch.nn.Linear(3, 2).double()
    alone.load_state_dict(model.state_dict())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(sgd, backward_passes_per_step=2)
    for m in (model, model, alone, alone):
        _backward(m)
    optimizer.step()  # one rank: the mean over ranks is its own sum of 2 passes
    for p, q in zip(model.parameters(), alone.parameters()):
        assert torch.equal(p.grad, q.grad)
        assert not torch.equal(p, q)  # the step moved the weights
    assert [len(f.names) for f in optimizer.last_fusions] == [2]
    optimizer.zero_grad()  # allowed again after step()
    _backward(model)
    optimizer.synchronize()  # a step after 1 of 2 passes, asked for: allowed
    before = model.weight.detach().clone()
    with optimizer.skip_synchronize():
        optimizer.step()
    assert not torch.equal(model.weight, before)


def test_bad_arguments_say_how_to_fix_them(one_rank):
    model = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Unknown op 'mean'. Choose one of"):
        hvd.DistributedOptimizer(sgd, op="mean")
    with pytest.raises(ValueError, match="backward_passes_per_step must be an integer"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match=r"1 parameter\(s\) of the optimizer are"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("weight", model.weight)])
    with pytest.raises(ValueError, match="root_rank=1 is not a rank of this group"):
        hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    with pytest.raises(ValueError, match="Unknown op"):
        hvd.allreduce(torch.ones(2), op=dist.ReduceOp.SUM)


# The hard cases (tests/hard_cases.py, every case the registry says horovod_api
# trains like one process), 41 samples, float32 and float64, on 2 and 4 ranks;
# ranks that start from noise added to their weights, or that build the model from
# seed + rank: broadcast_parameters gives them rank 0's. The fusion buffers are
# laid out in advance, so a parameter that only some ranks use (issue 19) is sent
# by every rank, as zeros where it got no gradient: one fusion buffer (the default)
# and one buffer per gradient. "accumulated" splits each rank's batch into two
# micro-batches: only for the cases whose forward does not count its calls.
HARD_CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.2, momentum=0.5, seed=3)
HARD_ACCUMULATED = replace(HARD_CONFIG, batch_size=24)  # an even share on 2-4 ranks
HARD_CASES = cases_for("horovod_api")
TOLERANCE = {torch.float64: 1e-14, torch.float32: 1e-6}  # measured 5.6e-17, 6.0e-8
HARD_RUNS = {
    "noise, one fusion": lambda build, d, X, y: (train, (build(d), X, y, HARD_CONFIG)),
    "noise, per gradient": lambda build, d, X, y: (
        train,
        (build(d), X, y, HARD_CONFIG, 1, 0.0),
    ),
    "accumulated": lambda build, d, X, y: (
        train,
        (build(d), X, y, HARD_ACCUMULATED, 2),
    ),
    "seed + rank": lambda build, d, X, y: (
        horovod_from_own_seed_rank,
        (functools.partial(build, d), 0, X, y, HARD_CONFIG),
    ),
}


def runs_of(case):
    """The runs of HARD_RUNS that compare ``case`` with one process."""
    return [r for r in HARD_RUNS if r != "accumulated" or case.one_forward_per_step]


@pytest.fixture(
    scope="module", params=REPLICATED_WORLD_SIZES, ids=lambda n: f"world{n}"
)
def hard_runs(request):
    """{(case name, dtype, run): Histories by rank}, every case in one launch,
    bounded (a collective that mismatches fails, never hangs)."""
    cases = [(c, d, r) for c in HARD_CASES for d in DTYPES for r in runs_of(c)]
    calls = [
        HARD_RUNS[r](case.build, d, *hard_case_data(dtype=d)) for case, d, r in cases
    ]
    per_rank = spawn(in_one_launch, request.param, calls, timeout=60.0, deadline=240.0)
    return {
        (case.name, d, r): [by_rank[i] for by_rank in per_rank]
        for i, (case, d, r) in enumerate(cases)
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", HARD_CASES, ids=lambda case: case.name)
def test_hard_cases_equal_one_process(hard_runs, case, dtype):
    for run in runs_of(case):
        model = case.build(dtype)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        config = HARD_ACCUMULATED if run == "accumulated" else HARD_CONFIG
        reference = one_process(model, *hard_case_data(dtype=dtype), config)
        assert max_parameter_difference(reference.parameters, start) > 1e-2  # trains
        results = hard_runs[(case.name, dtype, run)]
        assert_ranks_equal_one_process(
            case, start, results, reference, TOLERANCE[dtype], run
        )


def test_the_branch_is_taken_on_some_ranks_only():
    """SometimesUnusedNet's case is real here: in some step one rank's batch uses
    ``extra`` and another's does not, on 2 and on 3 ranks."""
    X, _ = hard_case_data(dtype=torch.float64)
    for world_size in (2, 3):
        batches = [
            run_batches(len(X), HARD_CONFIG, world_size, r)[0]
            for r in range(world_size)
        ]
        mixed = [
            step
            for step in zip(*batches)
            if len({bool((X[i][:, 0] > 1.5).any()) for i in step}) == 2
        ]
        assert mixed, world_size


def test_fusion_buffers_are_laid_out_in_advance_in_reverse_registration_order():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).double()
    params = list(
        model.parameters()
    )  # 0.weight 96 B, 0.bias 24, 1.weight 48, 1.bias 16
    plan = hvd_optimizer.plan_fusion_buffers
    reverse = params[::-1]
    assert plan(params, 0) == [[p] for p in reverse]  # one buffer per gradient
    assert plan(params, 128 * MiB) == [reverse]  # everything fits in one
    assert plan(params, 64) == [reverse[:2], [reverse[2]], [reverse[3]]]
    assert plan(params, 88) == [reverse[:3], [reverse[3]]]  # 16+48+24 = 88: full
    mixed = [params[0], params[1].float()]  # another dtype starts another buffer
    assert plan(mixed, 128 * MiB) == [[mixed[1]], [mixed[0]]]


def test_buffers_wait_for_a_missing_gradient_and_go_in_their_fixed_order(one_rank):
    """On a batch that does not take the branch, ``extra`` (registered last, so
    first in the layout) gets no gradient: nothing may be sent before it, and at
    step() it is sent first, as zeros, then the rest in the layout's order."""
    model = sometimes_unused_model(torch.float64)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        fusion_threshold_mb=0,
    )
    X, y = hard_case_data(dtype=torch.float64)
    keep = X[:, 0] <= 1.5  # no sample takes the branch
    torch.nn.functional.cross_entropy(model(X[keep]), y[keep]).backward()
    assert model.extra.weight.grad is None
    assert optimizer.fusions == []  # head's gradients wait behind extra's buffers
    optimizer.step()
    layout = ["extra.bias", "extra.weight", "head.bias", "head.weight"]
    assert [f.names for f in optimizer.last_fusions] == [[n] for n in layout]
    assert torch.equal(model.extra.weight.grad, torch.zeros_like(model.extra.weight))
    assert model.head.weight.grad.abs().sum() > 0
