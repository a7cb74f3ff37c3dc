"""A Llama-shaped step's memory and collectives on one rank of a fake mesh (20).

:func:`measure_llama` builds a :class:`~multigpu.cluster.llama.Llama` on the meta
device, applies tensor parallelism and FSDP2 on a fake (dp, tp) mesh (so every
shape is the real rank's), then allocates and runs one AdamW step under
``FakeTensorMode`` (``torch/_subclasses/fake_tensor.py``: tensors with shapes and
no data), with PyTorch's ``FSDPMemTracker``
(``torch/distributed/_tools/fsdp2_mem_tracker.py``) counting bytes by kind and
``CommDebugMode`` counting collectives. It reads the tracker after forward, after
backward, after the optimizer step, and its peak before the step: inside
``optimizer.step()`` the tracker records the DTensor wrappers of Adam's temporaries
with their whole (unsharded) size, a peak no rank reaches.

:func:`saved_in_one_block` lists what autograd keeps for backward inside one block
(``torch.autograd.graph.saved_tensors_hooks``): the census behind the activation
formula of :mod:`multigpu.costmodel.cluster`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from typing import Any

import torch

from multigpu.cluster.fake import count_collectives, fake_world
from multigpu.cluster.llama import Llama, LlamaShape, parallelize_llama
from multigpu.cluster.pin import check_torch_version

MOMENTS = ("after forward", "after backward", "after step", "peak")


def _categories(snapshot: dict) -> dict[str, int]:
    found: Counter = Counter()
    for per_device in snapshot.values():
        for kind, nbytes in per_device.items():
            found[str(getattr(kind, "value", kind))] += nbytes
    return dict(found)


def _build(shape: LlamaShape, dp: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        model = Llama(shape)
    return parallelize_llama(model, mesh)


def measure_llama(
    shape: LlamaShape,
    dp: int,
    tp: int,
    seq_len: int = 1024,
    batch: int = 1,
    layers: int | None = None,
) -> dict[str, Any]:
    """One AdamW step of ``shape`` (``layers`` of its blocks, all by default) on
    rank 0 of a fake dp x tp mesh: {moment: {kind: bytes}} for :data:`MOMENTS`, and
    "collectives": {name: count} (20)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    check_torch_version()
    if layers is not None:
        shape = dataclasses.replace(shape, layers=layers)
    found: dict[str, Any] = {}
    with fake_world(dp * tp), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(shape, dp, tp)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            tokens = torch.randint(0, shape.vocab, (batch, seq_len))
            tracker = FSDPMemTracker(model, optimizer)

            def step() -> None:
                loss = model(tokens).float().mean()
                found["after forward"] = _categories(tracker.get_tracker_snapshot())
                loss.backward()
                found["after backward"] = _categories(tracker.get_tracker_snapshot())
                found["peak"] = _categories(tracker.get_tracker_snapshot("peak"))
                optimizer.step()
                found["after step"] = _categories(tracker.get_tracker_snapshot())

            with tracker:
                found["collectives"] = count_collectives(step)
    return found


def _storage(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return id(local.untyped_storage())


def saved_in_one_block(
    shape: LlamaShape, dp: int, tp: int, seq_len: int = 1024, batch: int = 1
) -> list[tuple[tuple[int, ...], str, int]]:
    """(shape, dtype, bytes) of each storage autograd saves for backward inside
    the second block of a two-block ``shape`` on rank 0 of a fake dp x tp mesh,
    parameters left out (20)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    check_torch_version()
    two = dataclasses.replace(shape, layers=2)
    saved: dict[int, tuple[tuple[int, ...], str, int]] = {}
    with fake_world(dp * tp), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(two, dp, tp)
        block = model.layers[1]
        weights: set[int] = set()  # the block's whole (all-gathered) parameters

        def enter(*_: object) -> None:  # runs after FSDP2's all-gather
            weights.update(_storage(p) for p in block.parameters())

        block.register_forward_pre_hook(enter)
        block.register_forward_hook(lambda *_: weights.add(-1))
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")

            def pack(tensor: torch.Tensor) -> torch.Tensor:
                local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
                storage = local.untyped_storage()
                inside = weights and -1 not in weights
                if inside and id(storage) not in weights:
                    dtype = str(local.dtype).replace("torch.", "")
                    saved[id(storage)] = (tuple(local.shape), dtype, storage.nbytes())
                return tensor

            tokens = torch.randint(0, shape.vocab, (batch, seq_len))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model(tokens)
    return list(saved.values())


def tool_against_formula(
    measured: dict[str, Any], shape: LlamaShape, dp: int, tp: int, seq_len: int = 1024
) -> list[tuple[str, int, int]]:
    """(kind, the tracker's bytes, the formula's bytes) on rank 0 for a step of
    :func:`measure_llama` of ``shape`` (its ``layers`` as measured) on a dp x tp
    mesh: parameter shards, the root's whole parameters, activations, gradient
    shards and Adam's state (20)."""
    from multigpu.costmodel.cluster import llama_activation_bytes, llama_state_bytes

    state = llama_state_bytes(shape, dp, tp)
    rows = [
        ("fp32 parameter shards", "after forward", "Sharded Param", state["sharded"]),
        (
            "root's whole bf16 parameters",
            "after forward",
            "Unsharded Param",
            state["root whole"],
        ),
        (
            "activations",
            "after forward",
            "Activation",
            llama_activation_bytes(shape, tp, seq_len),
        ),
        ("fp32 gradient shards", "after step", "Sharded Grad", state["gradients"]),
        ("Adam's moments and step", "after step", "OptState", state["optimizer"]),
    ]
    return [(name, measured[when][kind], formula) for name, when, kind, formula in rows]
