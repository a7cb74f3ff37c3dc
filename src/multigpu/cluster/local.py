"""Every rank's value in one tensor: LocalTensor (20).

``torch.distributed._local_tensor`` (PyTorch's ``torch/distributed/_local_tensor/
__init__.py``) simulates N ranks in one thread: a ``LocalTensor`` holds one tensor
per rank (``._local_tensors``, a dict rank -> tensor), every operation is applied to
each of them, and a collective is computed from all of them at once. Inside
``LocalTensorMode(N)`` (over a fake process group of N ranks, which provides the
ranks' identities) ``rank_map(f)`` builds a LocalTensor holding ``f(r)`` on rank r,
and DTensor's tensor parallelism runs with every rank's shard in one tensor.
FSDP2 does not run (it resizes storages, which a LocalTensor cannot), nor does
send/recv.

:func:`local_all_reduce` sums per-rank values; :func:`local_tp_difference`
compares the two-block MLP under TP with one process; :func:`local_fsdp2_error`
returns FSDP2's error in one line.
"""

from __future__ import annotations

import copy
import warnings

import torch

from multigpu.cluster.fake import TwoLayerMLP, fake_world


def _mode(world_size: int):
    from torch.distributed._local_tensor import LocalTensorMode

    return LocalTensorMode(world_size)


def local_all_reduce(world_size: int) -> dict[int, list[float]]:
    """Rank r holds [r, r]; after ``dist.all_reduce`` every rank holds the sum:
    returns {rank: values} (20)."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import rank_map

    with fake_world(world_size), _mode(world_size):
        values = rank_map(lambda rank: torch.full((2,), float(rank)))
        dist.all_reduce(values)
        return {r: t.tolist() for r, t in sorted(values._local_tensors.items())}


def local_tp_difference(
    mesh_shape: tuple[int, int], dtype: torch.dtype = torch.float64
) -> dict[str, float]:
    """Tensor parallelism of a :class:`TwoLayerMLP` over the "tp" dimension of a
    (dp, tp) mesh of LocalTensor ranks: the largest |difference| from one process
    of the output and of ``up.weight``'s gradient, over every rank (20)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    reference = TwoLayerMLP().to(dtype)
    x = torch.randn(4, 8, dtype=dtype)
    model = copy.deepcopy(reference)
    want = reference(x)
    want.sum().backward()
    world_size = mesh_shape[0] * mesh_shape[1]
    with fake_world(world_size), _mode(world_size):
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        parallelize_module(model, mesh["tp"], plan)
        out = model(x)
        out.sum().backward()
        outputs = out.wait() if hasattr(out, "wait") else out
        grads = model.up.weight.grad.full_tensor()
        return {
            "output": max(
                (t - want).abs().max().item() for t in outputs._local_tensors.values()
            ),
            "gradient": max(
                (t - reference.up.weight.grad).abs().max().item()
                for t in grads._local_tensors.values()
            ),
        }


def local_fsdp2_error(world_size: int = 4) -> str:
    """FSDP2's error under LocalTensor, in one line (20)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TwoLayerMLP()
    with fake_world(world_size), _mode(world_size), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = init_device_mesh("cpu", (world_size,))
        fully_shard(model, mesh=mesh)
        try:
            model(torch.randn(4, 8)).sum().backward()
        except RuntimeError as error:
            return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return "no error"
