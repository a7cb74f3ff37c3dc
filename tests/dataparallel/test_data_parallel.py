"""DataParallel: one step equals a single-device step, PyTorch's exact errors and
warnings, and fidelity to nn.DataParallel."""

from __future__ import annotations

import copy
import re
import threading

import pytest
import torch
from torch import nn

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices
from multigpu.core.models import ConvNet
from tests.dataparallel.helpers import small_model

SCALAR_WARNING = (
    "Was asked to gather along dimension 0, but all input tensors were scalars; "
    "will instead unsqueeze and return a vector."
)


# ---------------------------------------------------------------------------
# (b) one DataParallel step == one single-device step on the whole batch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [12, 10, 7, 5, 3])
def test_one_step_equals_single_device(count, batch):
    torch.manual_seed(1)
    X = torch.randn(batch, 1, 8, 8)
    y = torch.randint(0, 10, (batch,))
    reference = small_model()
    model = copy.deepcopy(reference)

    expected = reference(X)
    nn.functional.cross_entropy(expected, y).backward()

    devices = simulated_devices(count)
    parallel = dp.DataParallel(dp.to_device(model, devices[0]), devices)
    output = parallel(X)
    nn.functional.cross_entropy(output, y).backward()

    torch.testing.assert_close(output, expected)
    for (name, p), q in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_replicas_are_summed_into_the_original_parameters():
    devices = simulated_devices(3)
    layer = dp.to_device(nn.Linear(1, 1, bias=False), devices[0])
    with torch.no_grad():
        layer.weight.fill_(1.0)
    parallel = dp.DataParallel(layer, devices)
    X = torch.tensor([[1.0], [2.0], [3.0]])  # one row per replica
    parallel(X).sum().backward()
    assert layer.weight.grad.item() == 6.0  # 1 + 2 + 3, one term from each replica


def test_no_grad_forward_matches_and_makes_no_graph():
    devices = simulated_devices(4)
    model = dp.to_device(small_model(), devices[0])
    X = torch.randn(9, 1, 8, 8)
    with torch.no_grad():
        out = dp.DataParallel(model, devices)(X)
        expected = model(X)
    assert not out.requires_grad
    torch.testing.assert_close(out, expected)


def test_batchnorm_differs_and_only_the_first_replica_updates_running_stats():
    torch.manual_seed(0)
    devices = simulated_devices(2)
    bn = nn.BatchNorm1d(3)
    reference = copy.deepcopy(bn)
    X = torch.randn(8, 3) * 3 + 1
    out = dp.DataParallel(dp.to_device(bn, devices[0]), devices)(X)
    expected = reference(X)
    assert not torch.allclose(out, expected)  # statistics per chunk, not per batch
    # the first replica shares storage with the module: its update is kept
    first_chunk = copy.deepcopy(reference)
    first_chunk.reset_running_stats()
    first_chunk(X[:4])
    torch.testing.assert_close(bn.running_mean, first_chunk.running_mean)
    assert bn.num_batches_tracked.item() == 1


def test_replicas_run_in_threads_and_only_as_many_as_chunks():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((threading.get_ident(), len(x)))
            return x

    devices = simulated_devices(4)
    dp.DataParallel(Probe(), devices)(torch.zeros(3, 1))  # 3 rows: 3 replicas
    assert sorted(rows for _, rows in seen) == [1, 1, 1]
    assert threading.get_ident() not in {ident for ident, _ in seen}

    seen.clear()
    dp.DataParallel(Probe(), devices[:1])(torch.zeros(3, 1))
    assert seen == [(threading.get_ident(), 3)]  # one device: called directly


# ---------------------------------------------------------------------------
# (c) exact error and warning texts, and clear errors for bad input
# ---------------------------------------------------------------------------


def test_parameters_must_be_on_device_ids_0():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Linear(2, 2), devices[1])
    with pytest.raises(RuntimeError) as info:
        dp.DataParallel(model, devices)(torch.randn(4, 2))
    assert str(info.value) == (
        "module must have its parameters and buffers on device gpu:0 "
        "(device_ids[0]) but found one of them on device: gpu:1"
    )
    with pytest.raises(RuntimeError, match="found one of them on device: cpu$"):
        dp.DataParallel(nn.Linear(2, 2), devices)(torch.randn(4, 2))
    # one device id: DataParallel moves the module there itself, as PyTorch does
    single = dp.DataParallel(nn.Linear(2, 2), devices[1:])
    assert single(torch.randn(4, 2)).shape == (4, 2)


def test_scalar_outputs_are_gathered_into_a_vector_with_a_warning():
    class LossInside(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, x):
            return self.linear(x).mean()  # a 0-dim tensor per replica

    devices = simulated_devices(4)
    model = dp.to_device(LossInside(), devices[0])
    with pytest.warns(UserWarning, match=re.escape(SCALAR_WARNING)):
        out = dp.DataParallel(model, devices)(torch.randn(5, 2))  # chunks 2, 2, 1
    assert out.shape == (3,)  # one entry per replica used


class ScaledLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x, scale=1.0):
        return self.linear(x) * scale


def test_uneven_last_batch_with_a_keyword_argument(torch_scatter_kwargs):
    devices = simulated_devices(4)
    model = dp.to_device(ScaledLinear(), devices[0])
    X = torch.randn(5, 3)  # 5 rows on 4 devices: chunks 2, 2, 1
    inputs, kwargs = dp.scatter_kwargs((X,), {"scale": 2.0}, devices)
    assert inputs[3] == () and kwargs[3] == {"scale": 2.0}  # the padded replica
    theirs = torch_scatter_kwargs((X,), {"scale": 2.0}, [0, 1, 2, 3])
    assert theirs[0][3] == ()
    with pytest.raises(TypeError) as info:
        dp.DataParallel(model, devices)(X, scale=2.0)
    message = str(info.value)
    assert message.startswith("Caught TypeError in replica 3 on device gpu:3.\n")
    assert message.endswith(
        "Original TypeError: ScaledLinear.forward() missing 1 required "
        "positional argument: 'x'"
    )
    assert isinstance(info.value.__cause__, TypeError)  # the original, traceback kept
    # the fixes: pass it positionally, or use a batch that fills every device
    assert dp.DataParallel(model, devices)(X, 2.0).shape == (5, 2)
    assert dp.DataParallel(model, devices)(X[:4], scale=2.0).shape == (4, 2)


def test_replica_exceptions_name_the_replica_and_device():
    class FailsOnSmallChunks(nn.Module):
        def forward(self, x):
            if len(x) < 2:
                raise ValueError("chunk too small")
            return x

    devices = simulated_devices(3)
    with pytest.raises(ValueError) as info:
        dp.DataParallel(FailsOnSmallChunks(), devices)(torch.zeros(5, 1))  # 2, 2, 1
    assert str(info.value) == (
        "Caught ValueError in replica 2 on device gpu:2.\n"
        "Original ValueError: chunk too small"
    )


def test_bad_device_lists_give_clear_errors():
    with pytest.raises(ValueError, match="empty list of devices"):
        dp.DataParallel(nn.Linear(1, 1), [])
    with pytest.raises(ValueError, match="Unknown device 'tpu:0'"):
        dp.DataParallel(nn.Linear(1, 1), ["tpu:0"])
    with pytest.raises(ValueError, match="empty list of devices"):
        dp.scatter(torch.ones(2), [])
    with pytest.raises(TypeError, match="needs a list of devices"):
        dp.scatter(torch.ones(2), "gpu:0")
    with pytest.raises(ValueError, match="no outputs to gather"):
        dp.gather([], "gpu:0")


def test_no_device_ids_without_cuda_is_a_clear_error(monkeypatch):
    from multigpu.dataparallel import data_parallel

    monkeypatch.setattr(data_parallel, "cuda_device_count", lambda: 0)
    with pytest.raises(ValueError) as error:
        dp.DataParallel(nn.Linear(1, 1))
    assert str(error.value) == (
        "DataParallel got no device_ids and this machine has no CUDA GPU. Pass "
        "simulated devices, e.g. device_ids=multigpu.core.devices.simulated_devices(2)."
    )


# ---------------------------------------------------------------------------
# (d) real GPUs: compare with nn.DataParallel itself
# ---------------------------------------------------------------------------


@pytest.mark.gpu(2)
@pytest.mark.parametrize("batch", [16, 9, 5, 3])
def test_matches_torch_dataparallel_on_gpus(batch):
    count = torch.cuda.device_count()
    torch.manual_seed(0)
    X = torch.randn(batch, 1, 8, 8)
    y = torch.randint(0, 10, (batch,))
    theirs_model = small_model().cuda(0)
    ours_model = copy.deepcopy(theirs_model)

    theirs = nn.DataParallel(theirs_model, device_ids=list(range(count)))
    ours = dp.DataParallel(ours_model, device_ids=list(range(count)))
    out_theirs, out_ours = theirs(X), ours(X)
    assert out_ours.device == out_theirs.device == torch.device("cuda", 0)
    torch.testing.assert_close(out_ours, out_theirs)
    nn.functional.cross_entropy(out_theirs, y.cuda(0)).backward()
    nn.functional.cross_entropy(out_ours, y.cuda(0)).backward()
    for p, q in zip(ours_model.parameters(), theirs_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.gpu(2)
def test_gpu_errors_match_torch_dataparallel():
    model = nn.Linear(2, 2).cuda(1)
    with pytest.raises(RuntimeError) as theirs:
        nn.DataParallel(model, device_ids=[0, 1])(torch.randn(4, 2))
    with pytest.raises(RuntimeError) as ours:
        dp.DataParallel(model, device_ids=[0, 1])(torch.randn(4, 2))
    assert str(ours.value) == str(theirs.value)


# ---------------------------------------------------------------------------
# (g) fidelity: unused parameters, BatchNorm, the optimizer, loading weights
# ---------------------------------------------------------------------------


class _WithSpare(nn.Module):
    """A linear layer, and a spare one that forward never uses."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.spare = nn.Linear(3, 2)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_an_unused_parameter_gets_a_zero_grad_on_two_or_more_devices(count):
    torch.manual_seed(0)
    devices = simulated_devices(count)
    model = dp.to_device(_WithSpare(), devices[0])
    reference = copy.deepcopy(model)
    X = torch.randn(7, 3)
    dp.DataParallel(model, devices)(X).sum().backward()
    reference(X).sum().backward()
    torch.testing.assert_close(model.used.weight.grad, reference.used.weight.grad)
    assert reference.spare.weight.grad is None  # one device, no DataParallel
    if count == 1:  # DataParallel calls the module itself: nothing replicated
        assert model.spare.weight.grad is None
    else:
        for grad in (model.spare.weight.grad, model.spare.bias.grad):
            assert torch.equal(grad, torch.zeros_like(grad))
            assert dp.device_of(grad) == devices[0]


def test_a_frozen_parameter_gets_no_grad_and_no_graph_without_grad():
    devices = simulated_devices(3)
    model = dp.to_device(_WithSpare(), devices[0])
    model.spare.requires_grad_(False)
    model.used.bias.requires_grad_(False)
    parallel = dp.DataParallel(model, devices)
    parallel(torch.randn(6, 3)).sum().backward()
    assert model.used.weight.grad is not None
    assert model.used.bias.grad is None and model.spare.weight.grad is None
    replica = dp.replicate(model, devices)[1]
    assert replica.used.weight.requires_grad and not replica.used.bias.requires_grad


def _cpu_comm(monkeypatch):
    """PyTorch's comm primitives on any device: broadcast by copying, reduce by
    adding (the CUDA versions move bytes; the autograd around them is the same)."""
    from torch.nn.parallel import comm

    def broadcast_coalesced(tensors, devices, buffer_size=None):
        return [
            [t.view_as(t) if i == 0 else t.clone() for t in tensors] for i in devices
        ]

    def reduce_add_coalesced(inputs, destination=None, buffer_size=None):
        return [sum(grads[1:], grads[0]) for grads in zip(*inputs, strict=True)]

    monkeypatch.setattr(comm, "broadcast_coalesced", broadcast_coalesced)
    monkeypatch.setattr(comm, "reduce_add_coalesced", reduce_add_coalesced)


def test_pytorchs_replicate_also_gives_an_unused_parameter_a_gradient(monkeypatch):
    # PyTorch's own replicate, Broadcast and ReduceAddCoalesced, run on "meta"
    # tensors (Broadcast refuses CPU ones) with CPU stand-ins for the comm calls.
    _cpu_comm(monkeypatch)
    model = _WithSpare().to("meta")
    model.used.bias.requires_grad_(False)
    replicas = torch.nn.parallel.replicate(model, [0, 1])
    outputs = [r(torch.zeros(2, 3, device="meta")) for r in replicas]
    torch.cat(outputs).sum().backward()
    assert model.spare.weight.grad is not None  # materialised zeros, summed
    assert model.spare.bias.grad is not None
    assert model.used.bias.grad is None  # requires_grad=False: no gradient


@pytest.mark.gpu(2)
def test_unused_parameter_grads_match_torch_dataparallel_on_gpus():
    model = _WithSpare().cuda(0)
    ours_model = copy.deepcopy(model)
    X = torch.randn(8, 3)
    nn.DataParallel(model, device_ids=[0, 1])(X).sum().backward()
    dp.DataParallel(ours_model, device_ids=[0, 1])(X).sum().backward()
    for p, q in zip(ours_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert torch.count_nonzero(ours_model.spare.weight.grad) == 0


@pytest.mark.parametrize("count", [2, 3, 4])
def test_batchnorm_replicas_normalise_their_own_chunk(count):
    torch.manual_seed(0)
    devices = simulated_devices(count)
    model = dp.to_device(ConvNet(width=4, batch_norm=True), devices[0])
    X = torch.randn(10, 1, 8, 8)
    chunks = X.chunk(count)
    alone = copy.deepcopy(model)  # each chunk through the model on its own
    expected = torch.cat([copy.deepcopy(alone)(chunk) for chunk in chunks])
    whole = copy.deepcopy(model)(X)  # the whole batch on one device
    out = dp.DataParallel(model, devices)(X)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, whole, atol=1e-3)
    # only replica 0's running statistics survive: those of the first chunk
    first = copy.deepcopy(alone)
    first(chunks[0])
    for name, buf in model.named_buffers():
        torch.testing.assert_close(buf, dict(first.named_buffers())[name], msg=name)
    # in eval mode the running statistics are used: the same as one device
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(dp.DataParallel(model, devices)(X), model(X))


def test_wrapping_the_optimizer_adds_nothing():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Linear(3, 2), devices[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    parallel = dp.DataParallel(model, devices)
    assert list(parallel.parameters()) == list(model.parameters())
    held = optimizer.param_groups[0]["params"]
    assert all(p is q for p, q in zip(held, model.parameters(), strict=True))
    assert list(dp.replicate(model, devices)[1].parameters()) == []
    wrapped = dp.DataParallel(optimizer, devices)  # accepted: it only stores it
    assert wrapped.module is optimizer
    with pytest.raises(AttributeError, match="'DataParallel' object has no attribute"):
        wrapped.step()


@pytest.mark.gpu(2)
def test_torch_dataparallel_wraps_an_optimizer_as_uselessly():
    optimizer = torch.optim.SGD(nn.Linear(3, 2).cuda(0).parameters(), lr=0.1)
    wrapped = nn.DataParallel(optimizer, device_ids=[0, 1])
    assert wrapped.module is optimizer
    with pytest.raises(AttributeError, match="'DataParallel' object has no attribute"):
        wrapped.step()


def test_weights_load_after_wrapping_and_only_the_device_matters():
    torch.manual_seed(0)
    devices = simulated_devices(2)
    trained = ConvNet(width=4)
    X = torch.randn(6, 1, 8, 8)
    for how in ("module", "prefix"):
        model = dp.to_device(ConvNet(width=4), devices[0])
        parallel = dp.DataParallel(model, devices)  # wrapped first
        if how == "module":
            parallel.module.load_state_dict(trained.state_dict())
        else:
            prefixed = {f"module.{k}": v for k, v in trained.state_dict().items()}
            parallel.load_state_dict(prefixed)
        assert {dp.device_of(p).name for p in model.parameters()} == {"gpu:0"}
        torch.testing.assert_close(parallel(X), trained(X))
    parallel.module.classifier = nn.Linear(32, 10)  # a new layer, on the CPU
    with pytest.raises(RuntimeError, match=r"on device gpu:0 \(device_ids\[0\]\)"):
        parallel(X)
    dp.to_device(parallel.module, devices[0])
    assert parallel(X).shape == (6, 10)
