"""The hand-built bucketed DDP (multigpu.miniddp.buckets) fills its buckets as
PyTorch's DDP does: with find_unused_parameters=False from step 2 on (both rebuild
once, in the order the gradients arrived), with find_unused_parameters=True from
step 1 on (neither ever rebuilds); record_torch_buckets shows PyTorch's buckets as
DDP's own logging data states them."""

import copy

import pytest
import torch
import torch.distributed as dist

from multigpu import miniddp
from multigpu.core.compare import max_parameter_difference
from multigpu.core.models import ConvNet
from multigpu.core.sizes import MiB
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import in_one_launch, spawn
from tests.hard_cases import hard_case_data, hard_case_model
from tests.ranks import torch_ddp_buckets_rank

TIMEOUT = 30.0


def test_bucketed_rebuilds_its_buckets_like_torch_ddp_from_step_2():
    model = ConvNet(in_channels=1, num_classes=3, width=4).double()
    per_rank = spawn(miniddp_ranks.layouts_rank, 2, model, 0.002, 3, timeout=TIMEOUT)
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


@pytest.fixture(scope="module")
def layouts():
    """Both wrappers' layouts at steps 1-3 on 2 ranks, keyed by (model, mode)."""
    conv = ConvNet(in_channels=1, num_classes=3, width=4).double()
    X, _ = hard_case_data(5)
    cases = {
        ("ConvNet", False): (conv, 0.002, 3, False),
        ("ConvNet", True): (conv, 0.002, 3, True),
        ("TiedFrozenNet", True): (hard_case_model(), 0.0002, 3, True, X),
    }
    calls = [(miniddp_ranks.layouts_rank, args) for args in cases.values()]
    per_rank = spawn(in_one_launch, 2, calls, timeout=TIMEOUT)
    assert per_rank[1] == per_rank[0]  # every rank has the same buckets
    return dict(zip(cases, per_rank[0]))


def test_without_unused_parameter_search_both_rebuild_once_after_step_1(layouts):
    ours, theirs = layouts["ConvNet", False]["ours"], layouts["ConvNet", False]["torch"]
    names = [
        n for n, _ in ConvNet(in_channels=1, num_classes=3, width=4).named_parameters()
    ]
    assert theirs[0] == [names]  # step 1: DDP sends one bucket ...
    assert [n for bucket in ours[0] for n in bucket] == names[::-1]  # ... ours guess
    assert ours[1] == theirs[1] != theirs[0]  # step 2: both rebuilt, alike
    assert ours[2] == theirs[2] == theirs[1]  # step 3: not rebuilt again


@pytest.mark.parametrize("model", ["ConvNet", "TiedFrozenNet"])
def test_with_unused_parameter_search_neither_ever_rebuilds(layouts, model):
    ours, theirs = layouts[model, True]["ours"], layouts[model, True]["torch"]
    assert len(theirs) == 3 and len(theirs[0]) > 1
    assert theirs[0] == theirs[1] == theirs[2]  # DDP never rebuilds here ...
    for step in range(3):  # ... and ours has DDP's buckets at every step
        assert ours[step] == theirs[step], f"step {step + 1}"


def test_record_torch_buckets_agrees_with_ddps_own_logging_data():
    torch.manual_seed(0)
    model = ConvNet(in_channels=1, num_classes=3, width=4).double()
    X = torch.randn(4, 1, 8, 8, dtype=torch.float64)  # the same batch on each rank
    per_rank = spawn(torch_ddp_buckets_rank, 2, model, 0.002, X, 3, timeout=TIMEOUT)
    result = per_rank[0]
    log, logged, names = result["log"], result["logged"], result["names"]
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}

    def nbytes(buckets):
        return [sum(sizes[n] for n in bucket) for bucket in buckets]

    assert len(log) == 3
    assert nbytes(log[0]) == [int(n) for n in logged["bucket_sizes"].split(", ")]
    rebuilt = [
        [names[int(i)] for i in bucket.split()]
        for bucket in logged["rebuilt_per_bucket_param_indices"].split(", ")
    ]
    assert log[1] == log[2] == rebuilt
    assert nbytes(log[1]) == [
        int(n) for n in logged["rebuilt_bucket_sizes"].split(", ")
    ]
    # The hook all-reduces as DDP does: 3 SGD steps on one batch, as one process.
    single = copy.deepcopy(model)
    optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        single(X).sum().backward()
        optimizer.step()
    assert max_parameter_difference(result["parameters"], single.state_dict()) < 1e-12
    assert per_rank[1]["log"] == log


def test_layout_helpers_refuse_the_other_wrapper_by_name():
    with pytest.raises(TypeError) as error:
        miniddp.bucket_layout(torch.nn.Linear(2, 2))
    assert str(error.value) == (
        "bucket_layout reads a BucketedDDP's buckets, got Linear. For PyTorch's DDP "
        "call record_torch_buckets(model) before training."
    )
    with pytest.raises(TypeError) as error:
        miniddp.record_torch_buckets(torch.nn.Linear(2, 2))
    assert str(error.value) == (
        "record_torch_buckets needs PyTorch's DistributedDataParallel, got Linear. "
        "For a BucketedDDP read bucket_layout(model)."
    )


@pytest.mark.parametrize("first", [None, 0.0005])
def test_assign_buckets_matches_pytorchs_rule(first):
    torch.manual_seed(1)
    tensors = [torch.zeros(int(n)) for n in torch.randint(1, 400, (40,))]
    cap = 0.001  # MiB
    limits = [int((first or cap) * MiB), int(cap * MiB)]
    expected, _ = dist._compute_bucket_assignment_by_size(
        tensors, limits, tensor_indices=list(range(len(tensors)))
    )
    sizes = [t.numel() * t.element_size() for t in tensors]
    assert miniddp.assign_buckets(sizes, cap, first) == expected
    assert len(expected) > 3
