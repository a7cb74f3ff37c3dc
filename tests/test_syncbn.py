"""The reference synchronized BatchNorm is BatchNorm over the global batch."""

import copy

import pytest
import torch
from torch import nn

from multigpu import syncbn
from multigpu.core.models import ConvNet
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import WorkerError, in_one_launch, spawn
from tests.hard_cases import cases_for, hard_case_data
from tests.ranks import forward_backward_rank

TIMEOUT = 60.0  # seconds for the rendezvous and each collective (only a hang waits)


def _batch():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4, 4, dtype=torch.float64) * 2 + 1
    layer = nn.BatchNorm2d(3).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    return x, layer


def _global(x, layer):
    """Plain BatchNorm on the whole batch, in this process."""
    layer = copy.deepcopy(layer).train()
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * out).sum().backward()
    return out.detach(), x.grad, layer


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_gets_the_global_batch_result(world_size):
    x, layer = _batch()
    out, grad, reference = _global(x, layer)
    results = spawn(
        forward_backward_rank, world_size, x, syncbn.convert_sync_batchnorm(layer)
    )
    torch.testing.assert_close(torch.cat([r["out"] for r in results]), out)
    torch.testing.assert_close(torch.cat([r["grad"] for r in results]), grad)
    for r in results:
        torch.testing.assert_close(r["weight grad"], reference.weight.grad)
        torch.testing.assert_close(r["running_mean"], reference.running_mean)
        torch.testing.assert_close(r["running_var"], reference.running_var)


def _shaped(shape, dtype=torch.float64, mean=1.0, seed=0):
    """A batch of ``shape`` (B, C, ...) and BatchNorm1d/2d with random affine."""
    torch.manual_seed(seed)
    x = (torch.randn(shape, dtype=torch.float64) * 2 + mean).to(dtype)
    kind = nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d
    layer = kind(shape[1]).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    return x, layer


def _gathered(results):
    return torch.cat([r["out"] for r in results]), torch.cat(
        [r["grad"] for r in results]
    )


# float64: (B, C), (B, C, L) and (B, C, H, W) batches over 3 ranks, split evenly,
# unevenly and with a rank that has no sample.
SHAPES = {"2-D": (13, 3), "3-D": (13, 3, 5), "4-D": (13, 3, 4, 4)}
SIZES = {"even": None, "uneven": [2, 7, 4], "empty rank": [6, 0, 7]}


def test_float64_any_shape_and_any_split_is_the_global_batch():
    cases = [(s, z) for s in SHAPES for z in SIZES]
    batches = {s: _shaped(shape) for s, shape in SHAPES.items()}
    calls = [
        (
            forward_backward_rank,
            (batches[s][0], syncbn.convert_sync_batchnorm(batches[s][1]), SIZES[z]),
        )
        for s, z in cases
    ]
    per_rank = spawn(in_one_launch, 3, calls, timeout=TIMEOUT)
    for i, (s, z) in enumerate(cases):
        results = [rank_results[i] for rank_results in per_rank]
        out, grad, reference = _global(*batches[s])
        if z == "empty rank":
            assert results[1]["out"].shape[0] == 0
        got_out, got_grad = _gathered(results)
        torch.testing.assert_close(got_out, out, msg=f"{s}, {z}")
        torch.testing.assert_close(got_grad, grad, msg=f"{s}, {z}")
        for r in results:
            torch.testing.assert_close(r["weight grad"], reference.weight.grad)
            torch.testing.assert_close(r["running_mean"], reference.running_mean)
            torch.testing.assert_close(r["running_var"], reference.running_var)


@pytest.mark.parametrize("sizes", [None, [1000, 0, 1048]], ids=["even", "empty rank"])
def test_float32_with_a_large_mean_matches_batchnorm(sizes):
    """Inputs 1e4 + N(0, 1): E[x²] - mean² cancels in float32 (the old reference
    gave variances of 8 and 16 and outputs 2.8 off). Tolerances: a float32 mean near
    1e4 is known to 1e-3 (its spacing), and nn.BatchNorm1d in float32 is itself
    3.6e-3 (outputs) and 8e-3 (input gradients) from the float64 result; so outputs
    within 1e-2, input gradients within 3e-2, running_var within 1e-4 relative."""
    torch.manual_seed(0)
    x = 1e4 + torch.randn(2048, 4)
    layer = nn.BatchNorm1d(4)
    out, grad, reference = _global(x, layer)
    results = spawn(
        forward_backward_rank,
        3,
        x,
        syncbn.convert_sync_batchnorm(layer),
        sizes,
        timeout=TIMEOUT,
    )
    got_out, got_grad = _gathered(results)
    assert not got_out.isnan().any()
    torch.testing.assert_close(got_out, out, rtol=0, atol=1e-2)
    torch.testing.assert_close(got_grad, grad, rtol=0, atol=3e-2)
    for r in results:
        torch.testing.assert_close(
            r["running_var"], reference.running_var, rtol=1e-4, atol=0
        )
        torch.testing.assert_close(
            r["running_mean"], reference.running_mean, rtol=0, atol=1e-3
        )
        torch.testing.assert_close(
            r["weight grad"], reference.weight.grad, rtol=1e-3, atol=1e-2
        )


def test_sizes_that_do_not_split_the_batch_are_refused():
    x, layer = _batch()
    with pytest.raises(ValueError) as raised:
        forward_backward_rank(0, 3, x, layer, [4, 4])
    assert str(raised.value) == (
        "sizes=[4, 4] do not split a batch of 8 over 3 ranks. Pass one size per "
        "rank, each >= 0, summing to 8."
    )


def test_per_rank_batchnorm_does_not():
    x, layer = _batch()
    out, _, _ = _global(x, layer)
    results = spawn(forward_backward_rank, 2, x, layer)
    difference = (torch.cat([r["out"] for r in results]) - out).abs().max().item()
    assert difference > 1e-2


def test_without_a_process_group_it_is_plain_batchnorm():
    x, layer = _batch()
    synced = syncbn.convert_sync_batchnorm(layer)
    torch.testing.assert_close(synced(x), layer.train()(x))
    synced.eval(), layer.eval()
    torch.testing.assert_close(synced(x), layer(x))


def test_convert_keeps_weights_dtype_and_keys():
    model = ConvNet(batch_norm=True).double()
    converted = syncbn.convert_sync_batchnorm(model)
    kinds = [type(m) for m in converted.modules()]
    assert syncbn.ReferenceSyncBatchNorm in kinds and nn.BatchNorm2d not in kinds
    assert converted.state_dict().keys() == model.state_dict().keys()
    for key, tensor in model.state_dict().items():
        assert torch.equal(converted.state_dict()[key], tensor)
        assert converted.state_dict()[key].dtype == tensor.dtype
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # unchanged


@pytest.mark.parametrize("case", cases_for("syncbn"), ids=lambda case: case.name)
def test_converting_a_hard_case_keeps_it_and_its_shards_sum_to_one_process(case):
    """A model of the registry (no BatchNorm) converted keeps every weight, buffer,
    tie and frozen flag; on shards of 20, 0 and 21 samples (one model per rank, as
    ranks hold them) its summed gradients are one process's on all 41, None where
    that one's is None. Without a BatchNorm nothing is exchanged, so this runs here."""
    model = case.build()
    converted = syncbn.convert_sync_batchnorm(model)
    assert converted is not model
    pairs = zip(
        model.named_parameters(remove_duplicate=False),
        converted.named_parameters(remove_duplicate=False),
        strict=True,
    )
    for (name, p), (their_name, q) in pairs:
        assert name == their_name and torch.equal(p, q), name
        assert p.requires_grad == q.requires_grad, name
    ties = [n for n, _ in converted.named_parameters(remove_duplicate=False)]
    assert len(ties) - len(list(converted.parameters())) == len(case.tied)
    for key, tensor in model.state_dict().items():
        assert torch.equal(converted.state_dict()[key], tensor), key
    X, y = hard_case_data()
    loss = nn.functional.cross_entropy(model(X), y, reduction="sum")
    loss.backward()
    summed = {}
    for part in (slice(0, 20), slice(20, 20), slice(20, 41)):
        rank_model = copy.deepcopy(converted)  # each rank its own copy
        logits = rank_model(X[part])
        nn.functional.cross_entropy(logits, y[part], reduction="sum").backward()
        for name, p in rank_model.named_parameters():
            if p.grad is not None:
                summed[name] = summed.get(name, 0) + p.grad
    for name, p in model.named_parameters():
        if p.grad is None:
            assert name not in summed, name
        else:
            torch.testing.assert_close(summed[name], p.grad, rtol=0, atol=1e-12)


def test_sync_batchnorm_refuses_cpu_tensors():
    with pytest.raises(WorkerError, match="SyncBatchNorm expected input tensor"):
        spawn(ddp_ranks.sync_batchnorm_on_cpu_rank, 2, timeout=30.0)


@pytest.mark.gpu(2)
def test_matches_nn_syncbatchnorm_on_gpus():
    x, layer = _batch()
    x, layer = x.float(), layer.float()
    ours = spawn(
        forward_backward_rank,
        2,
        x,
        syncbn.convert_sync_batchnorm(layer),
        backend="nccl",
    )
    theirs = spawn(
        forward_backward_rank,
        2,
        x,
        nn.SyncBatchNorm.convert_sync_batchnorm(layer),
        backend="nccl",
    )
    for a, b in zip(ours, theirs):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
