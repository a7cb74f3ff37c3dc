"""The Horovod-style API (multigpu.horovod_api) trains exactly like PyTorch's DDP and
like one process on the global batch, with one fusion buffer or many and with
backward_passes_per_step, from ranks that start with different weights; its fusion
buffers are sent during backward; its broadcasts and all-reduces give what
Horovod's give; and its mistakes are explained.

Each world size starts its ranks once and runs every multi-process check in that
launch; models and data are float64, so "equal" means equal to ~1e-15. The errors
are checked in this process, on a process group of one rank.
"""

import re

import pytest
import torch
import torch.distributed as dist
from conftest import convnet_problem

from multigpu import horovod_api as hvd
from multigpu import miniddp
from multigpu.allreduce_sgd import max_parameter_difference, world_losses
from multigpu.allreduce_sgd import train_single_process as single_process
from multigpu.core.train import TrainConfig
from multigpu.ddp import NotLaunchedByTorchrunError, in_one_launch
from multigpu.runtime.launch import spawn

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
TIMEOUT = 30.0
# About 1 KB, so that ConvNet(width=4)'s float64 gradients (3.4 KB) need several
# fusion buffers; the default (128 MB) holds them all in one.
TINY_MB = 0.001
FORMS = ("state_dict", "named_parameters", "parameters")


@pytest.fixture(scope="module")
def problem():
    return convnet_problem(NUM_SAMPLES)


@pytest.fixture(scope="module")
def reference(problem):
    return single_process(*problem, CONFIG)


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem):
    """Every multi-process check of one world size, in one launch: {label: results
    by rank}."""
    model, X, y = problem
    calls = {
        "one fusion": (hvd.train, (model, X, y, CONFIG)),
        "many fusions": (hvd.train, (model, X, y, CONFIG, 1, TINY_MB)),
        "accumulated": (hvd.train, (model, X, y, CONFIG, 2, TINY_MB)),
        "torch": (miniddp.train, (model, X, y, CONFIG, "torch")),
        "torch no_sync": (miniddp.train, (model, X, y, CONFIG, "torch", None, 2)),
        "fusion tiny": (hvd.fusion_worker, (model, X[:8], y[:8], TINY_MB)),
        "fusion default": (hvd.fusion_worker, (model, X[:8], y[:8], 128.0)),
        **{form: (hvd.broadcast_worker, (model, form)) for form in FORMS},
        "api": (hvd.api_worker, ()),
    }
    per_rank = spawn(
        in_one_launch, request.param, list(calls.values()), timeout=TIMEOUT
    )
    return {
        label: [results[i] for results in per_rank] for i, label in enumerate(calls)
    }


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
                assert sum(nbytes[n] for n in fusion) <= TINY_MB * miniddp.MB
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


@pytest.mark.parametrize("form", FORMS)
def test_broadcasts_make_ranks_from_different_seeds_agree(runs, form):
    results = runs[form]
    root = results[0]
    if len(results) > 1:
        assert max_parameter_difference(results[1]["before"], root["before"]) > 0.01
    for result in results:
        assert max_parameter_difference(result["after"], root["before"]) == 0
        assert result["lr"] == 0.1  # rank 0's, not 0.5
        for mine, roots in zip(result["momentum"], root["momentum"], strict=True):
            assert mine is not None and torch.equal(mine, roots)
    assert all(m.abs().sum() > 0 for m in root["momentum"])


def test_rank_size_and_allreduce_average_and_sum(runs):
    results = runs["api"]
    n = len(results)
    mean = torch.tensor([(n + 1) / 2, 10 * (n - 1) / 2], dtype=torch.float64)
    total = torch.tensor([n * (n + 1) / 2, 10 * n * (n - 1) / 2], dtype=torch.float64)
    for rank, result in enumerate(results):
        assert (result["rank"], result["size"]) == (rank, n)
        assert (result["local_rank"], result["local_size"]) == (rank, n)
        torch.testing.assert_close(result["average"], mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(result["sum"], total, rtol=0, atol=1e-12)
        in_place = result["in_place_average"]
        torch.testing.assert_close(in_place, mean, rtol=0, atol=1e-12)
        assert result["unchanged"] and result["in_place"]
        # shutdown() leaves spawn's process group alone; init() joins it again.
        assert result["after_shutdown"] == (False, True)
        assert result["after_init_again"]


NOT_INITIALIZED = (
    "hvd.{}() was called before hvd.init(), so there is no process group to ask. "
    "Call hvd.init() first, once at the start of the script (in a worker of "
    "multigpu.runtime.launch.spawn too)."
)


def test_calls_before_init_say_to_call_init_first():
    assert not hvd.is_initialized() and not dist.is_initialized()
    expected = re.escape(NOT_INITIALIZED.format("rank"))
    with pytest.raises(hvd.NotInitializedError, match=expected):
        hvd.rank()
    model = torch.nn.Linear(2, 2)
    for call, name in [
        (lambda: hvd.local_size(), "local_size"),
        (lambda: hvd.allreduce(torch.ones(2)), "allreduce"),
        (
            lambda: hvd.broadcast_parameters(model.state_dict(), 0),
            "broadcast_parameters",
        ),
        (
            lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.1)),
            "DistributedOptimizer",
        ),
    ]:
        with pytest.raises(ValueError, match=re.escape(NOT_INITIALIZED.format(name))):
            call()
    assert not hvd.is_initialized() and not dist.is_initialized()


def test_init_outside_torchrun_says_how_to_start_the_ranks(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(NotLaunchedByTorchrunError, match="torchrun --nproc-per-node=N"):
        hvd.init()
    assert not hvd.is_initialized() and not dist.is_initialized()


@pytest.fixture
def one_rank():
    """A process group of one rank in this process, gone after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        hvd.init()
        yield
    finally:
        hvd.shutdown()
        dist.destroy_process_group()
    assert not dist.is_initialized()


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


def test_call_map_is_a_table_with_one_row_per_horovod_call():
    columns = {"horovod", "torch.distributed", "here"}
    assert all(set(row) == columns for row in hvd.CALL_MAP)
    assert all(all(row.values()) for row in hvd.CALL_MAP)  # no empty cell
    calls = [row["horovod"] for row in hvd.CALL_MAP]
    assert len(set(calls)) == len(calls)
