"""The hand-built DDP (multigpu.miniddp) trains exactly like PyTorch's DDP and like
one process on the global batch, fills its buckets as DDP does from step 2 on,
and fails as clearly as DDP on a parameter without a gradient.

Each world size starts its ranks once and runs every training check in that launch;
models and data are float64, so "equal" means equal to ~1e-15.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from conftest import convnet_problem

from multigpu import miniddp
from multigpu.allreduce_sgd import max_parameter_difference
from multigpu.allreduce_sgd import train_single_process as single_process
from multigpu.core.models import ConvNet, mlp
from multigpu.core.train import TrainConfig
from multigpu.ddp import in_one_launch
from multigpu.miniddp import Event
from multigpu.runtime.launch import spawn

NUM_SAMPLES = 48  # 3 global batches of 16 per epoch, divisible by 1, 2 and 4 ranks
CONFIG = TrainConfig(epochs=2, batch_size=16, lr=0.2, momentum=0.5, seed=3)
TIMEOUT = 30.0
# Small buckets, so that ConvNet(width=4)'s gradients need several of them.
OPTIONS = {"bucket_cap_mb": 0.002}


@pytest.fixture(scope="module")
def problem():
    return convnet_problem(NUM_SAMPLES)


@pytest.fixture(scope="module")
def reference(problem):
    return single_process(*problem, CONFIG)


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"world{n}")
def runs(request, problem):
    """Every strategy, without and with no_sync accumulation, in one launch."""
    model, X, y = problem
    calls = [
        (miniddp.compare_worker, (model, X, y, CONFIG, miniddp.STRATEGIES, OPTIONS)),
        (
            miniddp.compare_worker,
            (model, X, y, CONFIG, miniddp.STRATEGIES, OPTIONS, 2),
        ),
    ]
    return spawn(in_one_launch, request.param, calls, timeout=TIMEOUT)


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
@pytest.mark.parametrize("accumulated", [False, True], ids=["plain", "no_sync"])
def test_every_strategy_trains_like_one_process_and_like_torch_ddp(
    runs, reference, strategy, accumulated
):
    per_rank = [results[int(accumulated)] for results in runs]
    ours = per_rank[0][strategy]
    assert max_parameter_difference(ours.parameters, reference.parameters) < 1e-12
    torch_ddp = per_rank[0]["torch"]
    assert max_parameter_difference(ours.parameters, torch_ddp.parameters) < 1e-12
    for other in per_rank[1:]:  # every rank ends with the same weights
        assert (
            max_parameter_difference(other[strategy].parameters, ours.parameters) == 0
        )
    assert len(ours.step_loss) == len(reference.step_loss)


def test_bucketed_rebuilds_its_buckets_like_torch_ddp_from_step_2():
    model = ConvNet(in_channels=1, num_classes=3, width=4).double()
    per_rank = spawn(miniddp.layouts_worker, 2, model, 0.002, 3, timeout=TIMEOUT)
    ours, theirs = per_rank[0]["ours"], per_rank[0]["torch"]
    names = [name for name, _ in model.named_parameters()]
    # Step 1: torch DDP sends everything as one bucket; ours follow the reverse
    # registration order.
    assert theirs[0] == [names]
    assert [n for bucket in ours[0] for n in bucket] == names[::-1]
    # From step 2 on: both in the order the gradients arrived, the same buckets.
    assert len(theirs[1]) > 1
    assert ours[1] == theirs[1] == ours[2] == theirs[2]
    assert ours[1] != ours[0]  # a conv's weight gradient arrives before its bias's
    assert per_rank[1] == per_rank[0]


@pytest.mark.parametrize("first", [None, 0.0005])
def test_assign_buckets_matches_pytorchs_rule(first):
    torch.manual_seed(1)
    tensors = [torch.zeros(int(n)) for n in torch.randint(1, 400, (40,))]
    cap = 0.001  # MiB
    limits = [int((first or cap) * miniddp.MB), int(cap * miniddp.MB)]
    expected, _ = dist._compute_bucket_assignment_by_size(
        tensors, limits, tensor_indices=list(range(len(tensors)))
    )
    sizes = [t.numel() * t.element_size() for t in tensors]
    assert miniddp.assign_buckets(sizes, cap, first) == expected
    assert len(expected) > 3


UNUSED_MESSAGE = (
    "2 parameter(s) received no gradient in this backward pass: head_b.weight, "
    "head_b.bias. Their gradients can never be all-reduced, so the other ranks "
    "would wait for them forever. Make every parameter take part in the loss, "
    "or pass find_unused_parameters=True (it costs a walk over the autograd "
    "graph after every forward and one more all-reduce)."
)


@pytest.mark.parametrize("strategy", miniddp.STRATEGIES)
def test_a_parameter_without_gradient_is_an_error(strategy):
    results = spawn(miniddp.unused_worker, 2, strategy, False, timeout=TIMEOUT)
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
        [(miniddp.unused_worker, (s, True, b_on_ranks)) for s in miniddp.STRATEGIES],
        timeout=TIMEOUT,
    )[0]
    by_strategy = dict(zip(miniddp.STRATEGIES, results))
    theirs = by_strategy["torch"]["parameters"]
    for strategy in miniddp.STRATEGIES:
        ours = by_strategy[strategy]["parameters"]
        assert max_parameter_difference(ours, theirs) < 1e-12
    torch.manual_seed(0)  # the weights unused_worker starts from
    initial = miniddp.BranchNet().double()
    moved = not torch.equal(theirs["head_b.weight"], initial.head_b.weight.detach())
    assert moved == bool(b_on_ranks)


def test_timeline_shows_buckets_overlapping_backward_and_flat_waiting():
    torch.manual_seed(0)
    model = mlp(width=64, depth=4)
    X, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    per_rank = spawn(
        miniddp.timeline_worker,
        2,
        model,
        X,
        y,
        ("flat", "bucketed"),
        {"bucket_cap_mb": 0.01},
        timeout=TIMEOUT,
    )
    for timelines in per_rank:
        flat, bucketed = timelines["flat"], timelines["bucketed"]

        def last_gradient(events):
            return max(
                e.end for e in events if e.lane == "backward" and e.name != "sync"
            )

        flat_comm = [e for e in flat if e.lane == "all-reduce"]
        assert [e.name for e in flat_comm] == ["all gradients"]
        assert flat_comm[0].start >= last_gradient(flat)
        assert miniddp.hidden_fraction(flat) == 0.0
        comm = [e for e in bucketed if e.lane == "all-reduce"]
        assert sorted(e.name for e in comm) == [f"bucket {i}" for i in range(len(comm))]
        assert len(comm) >= 3
        first = min(comm, key=lambda e: e.start)
        assert first.start < last_gradient(bucketed)  # sent while backward went on
        assert all(e.end >= e.start for e in bucketed)


def test_hidden_fraction_counts_communication_before_the_last_gradient():
    events = [
        Event("backward", "forward", 0.0, 1.0),
        Event("backward", "layer", 1.0, 3.0),
        Event("all-reduce", "bucket 0", 2.0, 4.0),  # half before 3.0
        Event("all-reduce", "bucket 1", 3.0, 5.0),  # none
        Event("backward", "sync", 3.0, 5.0),
    ]
    assert miniddp.hidden_fraction(events) == pytest.approx(0.25)
    assert miniddp.hidden_fraction(events[:2]) == 0.0


def test_fp16_compression_hook_is_close_but_not_equal(problem):
    model, X, y = problem
    # .float() converts in place: a copy, or the shared fixture changes for later tests
    model, X = copy.deepcopy(model).float(), X.float()
    calls = [
        (miniddp.train, (model, X, y, CONFIG, "torch", None, 1, compress))
        for compress in (False, True)
    ]
    plain, compressed = spawn(in_one_launch, 2, calls, timeout=TIMEOUT)[0]
    difference = max_parameter_difference(plain.parameters, compressed.parameters)
    assert 0 < difference < 1e-2


def test_bad_arguments_say_how_to_fix_them():
    with pytest.raises(ValueError, match="Unknown strategy 'ring'. Choose one of"):
        miniddp.wrap(torch.nn.Linear(2, 2), "ring")
    with pytest.raises(ValueError, match="The 'flat' strategy has no buckets"):
        miniddp.wrap(torch.nn.Linear(2, 2), "flat", bucket_cap_mb=1)
    with pytest.raises(RuntimeError, match="needs a process group"):
        miniddp.FlatDDP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        miniddp.BucketedDDP(torch.nn.Linear(2, 2), bucket_cap_mb=0)


SOLUTION = """
import torch.distributed as dist
from multigpu.miniddp import BucketedDDP


class MyDDP(BucketedDDP):
    def gradient_ready(self, param):
        bucket, i = self._bucket_of[id(param)]
        view = bucket.buffer[bucket.offsets[i] : bucket.offsets[i] + param.numel()]
        view.copy_(param.grad.reshape(-1)){divide}
        bucket.waiting.discard(id(param))
        if not bucket.waiting:
            {launch}

    def synchronize(self):
        for bucket in self.buckets:
            {finish}
"""
DIVIDE = ".div_(self.world_size)"
LAUNCH = "bucket.work = dist.all_reduce(bucket.buffer, async_op=True)"
COPY_BACK = """
            for p, offset in zip(bucket.params, bucket.offsets):
                p.grad.copy_(bucket.buffer[offset : offset + p.numel()].view_as(p))"""
RIGHT = {"divide": DIVIDE, "launch": LAUNCH, "finish": "bucket.work.wait()" + COPY_BACK}


@pytest.fixture
def learner_module():
    from multigpu.runtime import scratch

    yield lambda source: scratch.write_module("learner_ddp", source).MyDDP
    scratch.clean_up()


def test_check_wrapper_passes_a_right_bucketed_ddp(problem, learner_module):
    MyDDP = learner_module(SOLUTION.format(**RIGHT))
    passed, message = miniddp.check_wrapper(MyDDP, *problem, CONFIG)
    assert passed, message
    assert message.startswith("PASS: MyDDP trains like one process")


@pytest.mark.parametrize(
    "mistake, expected",
    [
        ({"finish": "bucket.work.wait()"}, "FAIL: the 2 ranks ended with different"),
        ({"divide": ""}, "FAIL: the ranks agree, but end"),
        (
            {"launch": "pass", "finish": "dist.all_reduce(bucket.buffer)" + COPY_BACK},
            "FAIL: the weights are right, but no all-reduce had started",
        ),
    ],
    ids=["no copy back", "no division", "all-reduces at the end"],
)
def test_check_wrapper_names_the_mistake(problem, learner_module, mistake, expected):
    MyDDP = learner_module(SOLUTION.format(**{**RIGHT, **mistake}))
    passed, message = miniddp.check_wrapper(MyDDP, *problem, CONFIG)
    assert not passed
    assert message.startswith(expected)


def test_check_wrapper_refuses_classes_the_ranks_cannot_import(problem):
    class Local(miniddp.BucketedDDP):
        pass

    Local.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in the notebook"):
        miniddp.check_wrapper(Local, *problem, CONFIG)
    with pytest.raises(TypeError, match="needs a subclass of BucketedDDP"):
        miniddp.check_wrapper(miniddp.FlatDDP, *problem, CONFIG)
