"""Parity of scatter, scatter_kwargs and gather with
torch.nn.parallel.scatter_gather."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch
from torch.nn.parallel import scatter_gather as torch_scatter_gather

from multigpu import dataparallel as dp
from multigpu.core.devices import simulated_devices

Pair = namedtuple("Pair", ["first", "second"])


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
