"""Many ranks that move nothing: the fake process group (20).

``dist.init_process_group("fake", rank=r, world_size=N)`` (PyTorch's
``torch/testing/_internal/distributed/fake_pg.py`` registers the backend; the
group itself is C++ ``FakeProcessGroup``) gives one process the identity of rank r
of N: a :class:`~torch.distributed.device_mesh.DeviceMesh` of any shape can be
built, FSDP2 and tensor parallelism can be applied, and every collective returns at
once without moving or changing a byte. ``CommDebugMode``
(``torch/distributed/tensor/debug/_comm_mode.py``) counts the collectives a
step issues. :func:`fake_world` opens and closes such a group;
:func:`count_collectives` counts what a function issues; :func:`mlp_step_collectives`
counts one FSDP2 x TP step of a two-block MLP on a (dp, tp) mesh.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from multigpu.cluster.pin import check_torch_version

# CommDebugMode's operator names, as the lesson writes them.
COLLECTIVE_NAMES = {
    "c10d._allgather_base_": "all-gather (FSDP)",
    "c10d._reduce_scatter_base_": "reduce-scatter (FSDP)",
    "c10d_functional.all_reduce": "all-reduce (TP)",
    "c10d_functional.all_gather_into_tensor": "all-gather (TP)",
    "c10d_functional.reduce_scatter_tensor": "reduce-scatter (TP)",
    "c10d.allreduce_": "all-reduce",
}


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """Inside the block this process is ``rank`` of ``world_size`` fake ranks;
    the group is destroyed on exit (20)."""
    check_torch_version()
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already open in this process; destroy it with "
            "dist.destroy_process_group() before opening a fake one."
        )
    hook = sys.excepthook  # init_process_group wraps it to prefix "[rank r]:"
    dist.init_process_group("fake", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def count_collectives(step: Callable[[], object]) -> dict[str, int]:
    """Run ``step()`` under ``CommDebugMode``; return {collective: count}, named as
    :data:`COLLECTIVE_NAMES` writes them (20)."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        step()
    counts: dict[str, int] = {}
    for op, count in comm.get_comm_counts().items():
        name = COLLECTIVE_NAMES.get(str(op), str(op))
        counts[name] = counts.get(name, 0) + count
    return dict(sorted(counts.items()))


class TwoLayerMLP(nn.Module):
    """x (batch, dim) -> up (dim, 4·dim) -> ReLU -> down: one tensor-parallel pair
    (column-wise, then row-wise) (20)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def shard_mlp_blocks(model: nn.Sequential, mesh) -> nn.Sequential:
    """Each block: tensor parallel over ``mesh["tp"]`` (up column-wise, down
    row-wise), then FSDP2 over ``mesh["dp"]``; FSDP2 at the root too (20)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    for block in model:
        parallelize_module(block, mesh["tp"], plan)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def mlp_step_collectives(
    mesh_shape: tuple[int, int], blocks: int = 2, dim: int = 8
) -> dict[str, int]:
    """Collectives of one forward and backward of ``blocks`` :class:`TwoLayerMLP`
    blocks under FSDP2 x TP on a fake (dp, tp) mesh of ``dp·tp`` ranks (20)."""
    from torch.distributed.device_mesh import init_device_mesh

    dp, tp = mesh_shape
    with fake_world(dp * tp), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's note on view outputs
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = nn.Sequential(*(TwoLayerMLP(dim) for _ in range(blocks)))
        shard_mlp_blocks(model, mesh)
        x = torch.randn(4, dim)
        return count_collectives(lambda: model(x).sum().backward())
