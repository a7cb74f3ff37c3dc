"""The hand-built bucketed DDP (multigpu.miniddp.buckets) fills its buckets as
PyTorch's DDP does, from step 2 on, by PyTorch's size rule."""

import pytest
import torch
import torch.distributed as dist

from multigpu import miniddp
from multigpu.core.models import ConvNet
from multigpu.core.units import MiB
from multigpu.ranks import miniddp as miniddp_ranks
from multigpu.runtime.launch import spawn

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
