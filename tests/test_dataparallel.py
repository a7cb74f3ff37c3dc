"""Tests for multigpu.dataparallel: parity with PyTorch's own code, equivalence with
single-device training, exact error and warning texts, the ledger and timeline."""

from __future__ import annotations

import copy
import re
import threading
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn
from torch.nn.parallel import scatter_gather as torch_scatter_gather

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices
from multigpu.core.models import ConvNet

SCALAR_WARNING = (
    "Was asked to gather along dimension 0, but all input tensors were scalars; "
    "will instead unsqueeze and return a vector."
)
Pair = namedtuple("Pair", ["first", "second"])


# ---------------------------------------------------------------------------
# (a) parity with torch.nn.parallel.scatter_gather.scatter_kwargs
# ---------------------------------------------------------------------------


class _CpuChunkScatter:
    """Stands in for PyTorch's CUDA-only ``Scatter`` autograd function: the same
    split (``tensor.chunk(len(devices), dim)``, since chunk_sizes is None), on CPU."""

    @staticmethod
    def apply(target_gpus, chunk_sizes, dim, tensor):
        assert chunk_sizes is None
        return tensor.chunk(len(target_gpus), dim)


@pytest.fixture
def torch_scatter_kwargs(monkeypatch):
    """PyTorch's own scatter_kwargs, runnable on a CPU."""
    monkeypatch.setattr(torch_scatter_gather, "Scatter", _CpuChunkScatter)
    return torch_scatter_gather.scatter_kwargs


def assert_same_structure(ours, theirs, where="result"):
    """Same container types and lengths, equal tensors, identical other objects."""
    assert type(ours) is type(theirs), f"{where}: {type(ours)} vs {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert ours.shape == theirs.shape, f"{where}: {ours.shape} vs {theirs.shape}"
        assert torch.equal(ours, theirs), f"{where}: values differ"
    elif isinstance(theirs, (tuple, list)):
        assert len(ours) == len(theirs), f"{where}: {len(ours)} vs {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_structure(a, b, f"{where}[{i}]")
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{where}: keys {list(ours)}"
        for key in theirs:
            assert_same_structure(ours[key], theirs[key], f"{where}[{key!r}]")
    else:
        assert ours is theirs, f"{where}: {ours!r} is not {theirs!r}"


def _cases(batch):
    """(name, inputs, kwargs, dim) built on a batch of ``batch`` rows."""
    x = torch.arange(batch * 3, dtype=torch.float32).reshape(batch, 3)
    y = torch.arange(batch)
    half = x[: max(1, batch // 2)]
    wide = torch.arange(2 * batch * 2).reshape(2, batch, 2)
    tag, options = "tag", {"mode": "train"}
    return [
        ("one tensor", (x,), {}, 0),
        ("two tensors", (x, y), None, 0),
        ("non-tensor keyword", (x,), {"scale": 2.0}, 0),
        ("tensor keyword", (x,), {"mask": y}, 0),
        ("only keywords", (), {"x": x, "flag": True}, 0),
        ("no inputs", (), {}, 0),
        ("mixed positional", (x, tag, 3, None), {"flag": False}, 0),
        ("tuple container", ((x, y),), {}, 0),
        ("list container", ([x, y, 5],), {"extra": {"a": x, "b": None}}, 0),
        ("dict container", ({"image": x, "label": y},), {}, 0),
        ("ordered dict", (OrderedDict(b=y, a=x),), {"w": options}, 0),
        ("namedtuple", (Pair(x, y),), {}, 0),
        ("shorter tensor", (x, half), {}, 0),
        ("shorter keyword", (x,), {"half": half, "s": 1}, 0),
        ("empty containers", (x, [], ()), {"d": {}}, 0),
        ("dim 1", (wide,), {"other": wide}, 1),
    ]


CASE_NAMES = [name for name, *_ in _cases(4)]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_scatter_kwargs_matches_pytorch(case, torch_scatter_kwargs):
    for batch in range(1, 13):
        _, inputs, kwargs, dim = next(c for c in _cases(batch) if c[0] == case)
        for count in range(1, 5):
            where = f"{case}, batch {batch}, {count} devices"
            theirs = torch_scatter_kwargs(inputs, kwargs, list(range(count)), dim)
            ours = dp.scatter_kwargs(inputs, kwargs, simulated_devices(count), dim)
            assert_same_structure(ours, theirs, where)


def test_scatter_matches_pytorch_for_a_lone_tensor(torch_scatter_kwargs):
    for batch in range(1, 13):
        x = torch.randn(batch, 2)
        for count in range(1, 5):
            theirs = torch_scatter_gather.scatter(x, list(range(count)))
            ours = dp.scatter(x, simulated_devices(count))
            assert isinstance(ours, tuple)  # a lone tensor gives a tuple, as in torch
            assert_same_structure(ours, theirs)


@pytest.mark.parametrize(
    ("batch", "sizes"),
    [(10, [3, 3, 3, 1]), (9, [3, 3, 3]), (5, [2, 2, 1]), (3, [1, 1, 1]), (8, [2] * 4)],
)
def test_scatter_sizes_on_four_devices(batch, sizes):
    assert dp.scatter_sizes(batch, 4) == sizes
    chunks = dp.scatter(torch.zeros(batch, 1), simulated_devices(4))
    assert [len(c) for c in chunks] == sizes
    assert [str(dp.device_of(c)) for c in chunks] == [
        f"gpu:{i}" for i in range(len(sizes))
    ]


def test_scatter_copies_tensors_and_shares_other_objects():
    devices = simulated_devices(2)
    x = torch.randn(4, 2)
    label, options = object(), {"mode": "train"}
    (a, b) = dp.scatter((x, label, options), devices)
    assert a[1] is label and b[1] is label  # one reference per device, no copy
    assert a[2] == options and a[2] is not options  # a dict is rebuilt (shallow)
    assert a[0].data_ptr() != x.data_ptr()  # copied from the CPU onto gpu:0
    # a tensor already on gpu:0 is not copied again for gpu:0, only for gpu:1
    on_first = dp.to_device(x, devices[0])
    first, second = dp.scatter(on_first, devices)
    assert first.data_ptr() == on_first.data_ptr()
    assert second.data_ptr() != on_first[2:].data_ptr()


def test_gather_matches_pytorch_structure():
    devices = simulated_devices(3)
    outputs = [
        {"logits": torch.full((2, 3), float(i)), "aux": Pair(torch.ones(2), None)}
        for i in range(3)
    ]
    gathered = dp.gather(outputs, devices[1])
    assert list(gathered) == ["logits", "aux"]
    assert gathered["logits"].shape == (6, 3)
    assert isinstance(gathered["aux"], Pair) and gathered["aux"].second is None
    assert str(dp.device_of(gathered["logits"])) == "gpu:1"
    with pytest.raises(ValueError, match="All dicts must have the same number of keys"):
        dp.gather([{"a": torch.ones(1)}, {"a": torch.ones(1), "b": 1}], devices[0])


# ---------------------------------------------------------------------------
# (b) one DataParallel step == one single-device step on the whole batch
# ---------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return ConvNet(in_channels=1, num_classes=10, width=4)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [12, 10, 7, 5, 3])
def test_one_step_equals_single_device(count, batch):
    torch.manual_seed(1)
    X = torch.randn(batch, 1, 8, 8)
    y = torch.randint(0, 10, (batch,))
    reference = _model()
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
    model = dp.to_device(_model(), devices[0])
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


def test_parallel_apply_checks_lengths_like_pytorch():
    layer = nn.Linear(1, 1)
    with pytest.raises(AssertionError, match="number of modules 2 is not equal to the"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)])
    with pytest.raises(AssertionError, match="the number of kwargs_tup 1"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)] * 2, [{}])
    with pytest.raises(AssertionError, match="the number of devices 3"):
        dp.parallel_apply([layer, layer], [torch.ones(1, 1)] * 2, None, ["gpu:0"] * 3)
    with pytest.raises(RuntimeError, match="no tensor input was found"):
        dp.parallel_apply([layer, layer], [(), ()])


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


def test_placement_helpers():
    devices = simulated_devices(2)
    x = torch.ones(3)
    assert str(dp.device_of(x)) == "cpu"
    on_first = dp.to_device(x, devices[0])
    assert str(dp.device_of(on_first)) == "gpu:0"
    assert dp.to_device(on_first, "gpu:0") is on_first  # already there: no copy
    on_second = dp.to_device(on_first, "gpu:1")
    assert on_second.data_ptr() != on_first.data_ptr()  # another device: a copy
    model = nn.Linear(2, 2)
    assert dp.to_device(model, "gpu:1") is model  # moved in place
    assert {str(dp.device_of(p)) for p in model.parameters()} == {"gpu:1"}
    assert set(dp.DataParallel(model, devices).state_dict()) == {
        "module.weight",
        "module.bias",
    }


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
    theirs_model = _model().cuda(0)
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
# (e) the ledger and the timeline
# ---------------------------------------------------------------------------


def test_ledger_shows_the_output_device_holding_more():
    devices = simulated_devices(4)
    model = dp.to_device(_model(), devices[0])
    X, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    loss, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    assert loss.dim() == 0
    totals = recorder.totals()
    assert sorted(totals) == [d.name for d in devices]
    assert all(totals["gpu:0"] > totals[d.name] for d in devices[1:])
    first = recorder.ledger["gpu:0"]
    assert first["gathered"] == 16 * 10 * 4 and first["loss"] == 4
    assert recorder.ledger["gpu:1"]["gathered"] == 0
    params = sum(p.numel() * 4 for p in model.parameters())
    assert {recorder.ledger[d.name]["parameters"] for d in devices} == {params}
    assert {recorder.ledger[d.name]["replica gradients"] for d in devices} == {params}
    assert first["gradients"] == params
    # ConvNet(width=4) saves per row: two ReLU outputs (4 and 8 channels of 8x8)
    # and the pooled features (8 x 2 x 2) that the classifier reads
    per_row = (4 * 64 + 8 * 64 + 8 * 4) * 4
    assert recorder.ledger["gpu:1"]["activations"] == 4 * per_row
    # the loss keeps its log-softmax (16 x 10) and a 1-element total weight
    assert first["activations"] == 4 * per_row + 16 * 10 * 4 + 4


def test_output_device_moves_the_gathered_outputs():
    devices = simulated_devices(3)
    model = dp.to_device(_model(), devices[0])
    parallel = dp.DataParallel(model, devices, output_device=devices[2])
    X, y = torch.randn(9, 1, 8, 8), torch.randint(0, 10, (9,))
    loss, recorder = dp.record_step(parallel, X, y)
    assert str(dp.device_of(loss)) == "gpu:2"
    assert recorder.ledger["gpu:2"]["gathered"] > 0
    assert recorder.ledger["gpu:0"]["gathered"] == 0


def test_timeline_has_events_for_every_replica():
    devices = simulated_devices(4)
    model = dp.to_device(_model(), devices[0])
    X, y = torch.randn(10, 1, 8, 8), torch.randint(0, 10, (10,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    events = recorder.events
    for name in ("scatter", "replicate", "forward", "backward"):
        assert {e.device for e in events if e.name == name} == {
            d.name for d in devices
        }, name
    assert [e.device for e in events if e.name in ("gather", "loss")] == ["gpu:0"] * 2
    assert all(0 <= e.start <= e.end for e in events)
    forward_end = max(e.end for e in events if e.name == "forward")
    gather = next(e for e in events if e.name == "gather")
    assert gather.start >= forward_end  # the gather waits for every replica
    # as in PyTorch, scatter (comm.scatter) and replicate (one coalesced broadcast)
    # are each one call for all the devices: one span, drawn on every lane
    spans = {
        name: {(e.start, e.end) for e in events if e.name == name}
        for name in ("scatter", "replicate")
    }
    assert [len(s) for s in spans.values()] == [1, 1]
    [(_, scatter_end)], [(replicate_start, replicate_end)] = spans.values()
    assert scatter_end <= replicate_start
    assert replicate_end <= min(e.start for e in events if e.name == "forward")


def test_one_device_timeline():
    devices = simulated_devices(1)
    X, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    _, recorder = dp.record_step(dp.DataParallel(_model(), devices), X, y)
    names = [e.name for e in recorder.events]
    assert names == ["scatter", "forward", "loss", "backward"]  # no replicas
    assert set(recorder.ledger) == {"gpu:0"}


def _tiny(devices):
    """Linear(3, 5) -> ReLU -> Linear(5, 2): 32 parameters, 128 bytes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    return dp.to_device(model, devices[0])


@pytest.mark.parametrize(("count", "rows"), [(4, [3, 3, 3, 1]), (1, [10])])
def test_ledger_counts_every_category_exactly(count, rows):
    devices = simulated_devices(count)
    X, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    _, recorder = dp.record_step(dp.DataParallel(_tiny(devices), devices), X, y)
    assert list(recorder.ledger) == [d.name for d in devices[: len(rows)]]
    for i, (device, n) in enumerate(zip(devices, rows, strict=False)):
        first = i == 0
        expected = {
            "parameters": 128,  # a replica of the 32 weights (the model on gpu:0)
            "inputs": n * 3 * 4 + (10 * 8 if first else 0),  # + int64 targets
            # saved for backward: the ReLU output (n x 5, also Linear 2's input);
            # on the output device the loss's log-softmax (10 x 2) + total weight
            "activations": n * 5 * 4 + (10 * 2 * 4 + 4 if first else 0),
            "outputs": n * 2 * 4,
            "gathered": 10 * 2 * 4 if first and count > 1 else 0,
            "loss": 4 if first else 0,
            # every replica's full set of weight gradients, before they are summed;
            # one device has no replicas: gradients go straight into .grad
            "replica gradients": 128 if count > 1 else 0,
            "gradients": 128 if first else 0,
        }
        assert recorder.ledger[device.name] == expected, device.name
        assert list(recorder.ledger[device.name]) == list(dp.CATEGORIES)


@pytest.mark.parametrize("count", [1, 3])
def test_ledger_with_a_missing_bias(count):
    devices = simulated_devices(count)
    model = dp.to_device(nn.Linear(3, 2, bias=False), devices[0])
    X, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    assert {held["parameters"] for held in recorder.ledger.values()} == {3 * 2 * 4}
    assert recorder.ledger["gpu:0"]["gradients"] == 3 * 2 * 4


def test_an_output_saved_for_backward_is_counted_once():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Sequential(nn.Linear(3, 5), nn.ReLU()), devices[0])
    recorder = dp.Recorder()
    out = recorder.watch(dp.DataParallel(model, devices))(torch.randn(4, 3))
    assert out.shape == (4, 5)
    for device in devices:  # ReLU saves its result, which is the output itself
        held = recorder.ledger[device.name]
        assert (held["activations"], held["outputs"]) == (0, 2 * 5 * 4)


def test_recording_keeps_the_in_place_check():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2)

        def forward(self, x):
            out = self.linear(x).exp()  # exp saves its result for backward
            out.add_(1)  # ... which is then modified in place
            return out

    devices = simulated_devices(2)
    model = dp.to_device(InPlace(), devices[0])
    parallel = dp.DataParallel(model, devices)
    X, unused_targets = torch.randn(4, 2), torch.zeros(4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        dp.record_step(parallel, X, unused_targets, lambda out, _: out.sum())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        parallel(X).sum().backward()  # the same error without recording


def test_gradients_are_placed_with_their_parameters():
    devices = simulated_devices(3)
    model = _tiny(devices)
    dp.DataParallel(model, devices)(torch.randn(6, 3)).sum().backward()
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:0"}
    dp.to_device(model, devices[2])  # moving the module moves its gradients too
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:2"}
    model.zero_grad(set_to_none=True)
    model(torch.randn(2, 3)).sum().backward()  # a new .grad, from a plain backward
    assert {str(dp.device_of(p.grad)) for p in model.parameters()} == {"gpu:2"}
    copied = copy.deepcopy(model)  # a copy is not placed, nor are its gradients
    copied(torch.randn(2, 3)).sum().backward()
    assert {str(dp.device_of(p)) for p in copied.parameters()} == {"cpu"}
    assert {str(dp.device_of(p.grad)) for p in copied.parameters()} == {"cpu"}


def _allocator_peak(step):
    """Run ``step()`` under PyTorch's profiler and return (the most bytes the CPU
    allocator held at once above what it held before, step's result): an
    independent count, from the allocator's own reports, of the current thread."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    events = prof.profiler.kineto_results.events()
    memory = sorted(
        (e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    held = peak = 0
    for event in memory:  # + bytes allocated, - bytes freed
        held += event.nbytes()
        peak = max(peak, held)
    return peak, result


@pytest.mark.parametrize("batch", [1, 64, 333])
def test_one_device_peak_matches_the_allocator(batch):
    # One device: the whole step runs in this thread, where the profiler sees every
    # allocation. An MLP's ops allocate nothing but their results, so the two
    # counts agree to the byte, on the first step and on the next (which sums
    # into the .grad of the first).
    torch.manual_seed(0)
    devices = simulated_devices(1)
    mlp = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))
    parallel = dp.DataParallel(dp.to_device(mlp, devices[0]), devices)
    X, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    weights = sum(p.numel() * 4 for p in mlp.parameters())
    for held_before in (weights, 2 * weights):  # the weights, then also .grad
        peak, (_, recorder) = _allocator_peak(lambda: dp.record_step(parallel, X, y))
        assert list(recorder.peak) == ["gpu:0"]
        assert recorder.peak["gpu:0"] == held_before + peak
        assert recorder.live == {"gpu:0": 2 * weights + 4}  # + .grad, + the loss


def test_replica_peaks_by_hand():
    # Linear(3, 5) -> ReLU -> Linear(5, 2) on 2 devices, 4 rows each (float32).
    devices = simulated_devices(2)
    X, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    chunk, weights, hidden, out = 4 * 3 * 4, 128, 4 * 5 * 4, 4 * 2 * 4
    recorder = dp.Recorder()
    recorder.watch(dp.DataParallel(_tiny(devices), devices))(X)  # forward only
    # gpu:1, in its replica's thread: its chunk and its copy of the weights, and at
    # the ReLU the first Linear's output next to the ReLU's (which replaces it).
    # gpu:0 holds the same (its replica is the model itself), then the gathered
    # outputs (8 x 2) next to its own output and the ReLU's, which backward needs.
    assert recorder.peak == {
        "gpu:0": chunk + weights + hidden + out + 8 * 2 * 4,
        "gpu:1": chunk + weights + 2 * hidden,
    }
    assert recorder.peak["gpu:1"] == 336
    # a whole step: backward on gpu:1 never holds more than its forward did, and
    # afterwards only the model's weights, their .grad and the loss remain
    _, recorder = dp.record_step(dp.DataParallel(_tiny(devices), devices), X, y)
    assert recorder.peak["gpu:1"] == 336
    assert recorder.live == {"gpu:0": 2 * weights + 4, "gpu:1": 0}


def test_the_ledger_is_not_the_peak():
    # ConvNet(width=4): a convolution's output lives until its ReLU replaces it,
    # and backward holds activation gradients next to the activations, so the
    # measured peak exceeds the sum of the ledger on every device.
    devices = simulated_devices(4)
    model = dp.to_device(_model(), devices[0])
    X, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    totals, peak = recorder.totals(), recorder.peak
    assert list(peak) == list(totals) == [d.name for d in devices]
    assert all(peak[d] > totals[d] for d in totals)
    assert peak["gpu:1"] == peak["gpu:2"] == peak["gpu:3"] < peak["gpu:0"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert recorder.live == {
        "gpu:0": 2 * params + 4,
        "gpu:1": 0,
        "gpu:2": 0,
        "gpu:3": 0,
    }
    # the same step untracked: the same ledger and timeline, no peak
    model.zero_grad(set_to_none=True)
    _, untracked = dp.record_step(
        dp.DataParallel(model, devices), X, y, track_memory=False
    )
    assert untracked.ledger == recorder.ledger
    assert untracked.peak == {} and untracked.live == {}
    assert sorted((e.device, e.name) for e in untracked.events) == sorted(
        (e.device, e.name) for e in recorder.events
    )


@pytest.mark.gpu(1)
def test_peak_matches_cuda_max_memory_allocated():
    # On a real GPU the caching allocator counts every byte: the measured peak
    # above what was held before equals its peak, up to its rounding of each
    # block to 512 bytes (and the few bytes its kernels allocate inside one op).
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1000))
    parallel = dp.DataParallel(mlp.to("cuda:0"), ["cuda:0"])
    X, y = torch.randn(512, 1024), torch.randint(0, 1000, (512,))
    dp.record_step(parallel, X, y)  # warm up: cuBLAS's workspace, the kernels
    mlp.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    torch.cuda.reset_peak_memory_stats(0)
    _, recorder = dp.record_step(parallel, X, y)
    torch.cuda.synchronize()
    allocator = torch.cuda.max_memory_allocated(0) - before
    weights = sum(p.numel() * p.element_size() for p in mlp.parameters())
    assert list(recorder.peak) == ["cuda:0"]
    assert recorder.peak["cuda:0"] - weights == pytest.approx(allocator, rel=0.01)


# ---------------------------------------------------------------------------
# (f) the recorder attaches from outside
# ---------------------------------------------------------------------------


def test_recording_changes_nothing_it_records():
    devices = simulated_devices(3)
    X, y = torch.randn(7, 1, 8, 8), torch.randint(0, 10, (7,))
    plain_model, watched_model = _model(), _model()
    plain = dp.DataParallel(dp.to_device(plain_model, devices[0]), devices)
    watched = dp.DataParallel(dp.to_device(watched_model, devices[0]), devices)
    recorder = dp.Recorder()
    recorded = recorder.watch(watched)
    assert recorded.module is watched_model  # shares the module, copies nothing
    assert recorded.state_dict().keys() == plain.state_dict().keys()
    out_plain, out_recorded = plain(X), recorded(X)
    torch.testing.assert_close(out_recorded, out_plain, rtol=0, atol=0)
    nn.functional.cross_entropy(out_plain, y).backward()
    nn.functional.cross_entropy(out_recorded, y).backward()
    for p, q in zip(plain_model.parameters(), watched_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)
    assert sorted({e.device for e in recorder.events}) == ["gpu:0", "gpu:1", "gpu:2"]
    # per device: scatter, replicate, forward, backward; one gather on gpu:0
    assert len(recorder.events) == 3 * 4 + 1
    first, last = (
        min(e.start for e in recorder.events),
        max(e.end for e in recorder.events),
    )
    assert recorder.duration() == last - first > 0
    assert dp.Recorder().duration() == 0.0  # nothing recorded yet
    # the plain module records nothing: recording lives in RecordingDataParallel
    assert not hasattr(plain, "recorder")


def test_watch_needs_our_dataparallel():
    with pytest.raises(TypeError) as error:
        dp.Recorder().watch(nn.Linear(2, 2))
    assert str(error.value) == (
        "Recorder.watch records a multigpu.dataparallel.DataParallel, got Linear. "
        "Wrap your module first, e.g. dp.DataParallel(model, devices)."
    )


def test_replica_weights_are_the_replicas_copies():
    devices = simulated_devices(2)
    model = dp.to_device(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), devices[0])
    model[1].weight = model[0].bias  # one tensor shared by two submodules
    replicas = dp.replicate(model, devices)
    originals = [*model.parameters(), *model.buffers()]
    for device, replica in zip(devices, replicas, strict=True):
        copies = dp.replica_weights(model, replica)
        assert len(copies) == len(originals) == 2 + 1 + 3  # the shared one once
        for replica_copy, original in zip(copies, originals, strict=True):
            torch.testing.assert_close(replica_copy, original, rtol=0, atol=0)
            assert dp.device_of(replica_copy) == device
            shared = replica_copy.data_ptr() == original.data_ptr()
            assert shared == (device == devices[0])


def test_watch_moves_sees_only_the_moves_inside_it():
    from multigpu.dataparallel.placement import watch_moves

    seen = []
    x = torch.ones(4)
    with watch_moves(lambda moved, device, start, end: seen.append(device.name)):
        dp.to_device(x, "gpu:1")
        dp.scatter(x, simulated_devices(2))
    dp.to_device(x, "gpu:0")
    assert seen == ["gpu:1", "gpu:0", "gpu:1"]


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
