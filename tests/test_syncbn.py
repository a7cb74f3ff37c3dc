"""The reference synchronized BatchNorm is BatchNorm over the global batch."""

import copy

import pytest
import torch
from torch import nn

from multigpu import syncbn
from multigpu.core.models import ConvNet
from multigpu.ranks import ddp as ddp_ranks
from multigpu.runtime.launch import WorkerError, spawn
from tests.ranks import forward_backward_rank


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
