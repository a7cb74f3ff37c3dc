"""The ranks of notebook 20 and the launchers that start them (20).

:func:`fsdp_tp_thread_rank` trains the two-block MLP of :mod:`multigpu.cluster.fake`
under FSDP2 x TP on one rank; :func:`fsdp_tp_difference` runs it on thread ranks
(:func:`multigpu.cluster.threaded.run_threaded`) and compares with one process.
:func:`small_gpt_rank` trains 19's tiny GPT for one Adam step under each
(dp, tp) grid it is given, FSDP2 over dp and 15's tensor-parallel block plan
over tp, and measures what the planner predicts: the bytes of parameters,
gradients and Adam's moments the rank holds, and the collectives of the step.
:func:`measure_small_gpt` starts it on real processes (gloo).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence

import torch
from torch import nn

from multigpu.cluster.fake import shard_mlp_blocks
from multigpu.cluster.threaded import make_mlp, mlp_data, run_threaded, train_sgd
from multigpu.runtime.launch import SLOW_TIMEOUT_S, spawn

__all__ = [
    "fsdp_tp_difference",
    "fsdp_tp_thread_rank",
    "measure_small_gpt",
    "small_gpt_rank",
]


def _local_bytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _parallelize(model, dp: int, tp: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from multigpu.tensor_parallel.dtensor import parallelize_block

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    for block in model.blocks:
        if tp > 1:
            parallelize_block(block, mesh["tp"])
        if dp > 1:
            fully_shard(block, mesh=mesh["dp"])
    if dp > 1:
        fully_shard(model, mesh=mesh["dp"])
    return mesh


def _adam_step(model, optimizer, inputs, targets) -> None:
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    )
    loss.backward()
    optimizer.step()


def small_gpt_rank(
    rank: int, world_size: int, model, grids: Sequence[tuple[int, int]]
) -> list[dict]:
    """Rank function: for each (dp, tp) grid of ``world_size`` ranks, one Adam step
    of a copy of ``model`` on this rank's dp part of a batch; returns per grid
    the bytes held ("parameters", "gradients", "optimizer") and the collectives
    (20)."""
    import warnings

    from multigpu.cluster.fake import count_collectives
    from multigpu.gpt4d.model import make_token_batches

    results = []
    for dp, tp in grids:
        if dp * tp != world_size:
            raise ValueError(
                f"grid dp={dp} x tp={tp} is not {world_size} ranks; pass grids "
                "whose product is the world size."
            )
        replica = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mesh = _parallelize(replica, dp, tp)
        optimizer = torch.optim.Adam(replica.parameters(), lr=1e-3, foreach=False)
        inputs, targets = make_token_batches(replica.config, (4,))[0]
        part = mesh.get_local_rank("dp")
        inputs, targets = inputs.chunk(dp)[part], targets.chunk(dp)[part]

        step = functools.partial(_adam_step, replica, optimizer, inputs, targets)
        collectives = count_collectives(step)
        moments = [
            _local_bytes(state[key])
            for state in optimizer.state.values()
            for key in ("exp_avg", "exp_avg_sq")
        ]
        results.append(
            {
                "parameters": sum(_local_bytes(p) for p in replica.parameters()),
                "gradients": sum(_local_bytes(p.grad) for p in replica.parameters()),
                "optimizer": sum(moments),
                "collectives": collectives,
            }
        )
    return results


def measure_small_gpt(
    model, grids: Sequence[tuple[int, int]], world_size: int = 2
) -> list[list[dict]]:
    """Start :func:`small_gpt_rank` on ``world_size`` processes; per rank, its list
    of per-grid results (20)."""
    return spawn(small_gpt_rank, world_size, model, grids, timeout=SLOW_TIMEOUT_S)


def fsdp_tp_thread_rank(
    rank: int, world_size: int, model: nn.Module, tp: int, steps: int = 3
) -> dict[str, torch.Tensor]:
    """One thread rank: its copy of ``model`` under FSDP2 over dp = world_size / tp
    and TP over tp, SGD on its dp part of the batch; returns the full parameters.
    The threads share the random generator: the model is built before they
    start, never inside them (20)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dp = world_size // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = shard_mlp_blocks(copy.deepcopy(model), mesh)
    x, y = mlp_data(next(model.parameters()).dtype)
    part = mesh.get_local_rank("dp")
    train_sgd(model, x.chunk(dp)[part], y.chunk(dp)[part], steps)
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in model.named_parameters()
    }


def fsdp_tp_difference(
    dp: int, tp: int, dtype: torch.dtype = torch.float64, steps: int = 3
) -> float:
    """Largest |difference| between the parameters of FSDP2 x TP on dp·tp thread
    ranks (every rank's full copy) and one process, after ``steps`` SGD steps (20)."""
    x, y = mlp_data(dtype)
    if len(x) % dp:
        raise ValueError(
            f"dp={dp} does not divide the {len(x)} rows; choose dp in 1, 2, 4, 8, 16."
        )
    initial = make_mlp(dtype=dtype)
    reference = copy.deepcopy(initial)
    train_sgd(reference, x, y, steps)
    want = dict(reference.named_parameters())
    # FSDP2 x TP work between collectives: a loaded machine's wait, not a quick probe's
    ranks = run_threaded(
        fsdp_tp_thread_rank, dp * tp, initial, tp, steps, timeout=SLOW_TIMEOUT_S
    )
    return max(
        (state[name] - want[name]).abs().max().item()
        for state in ranks
        for name in want
    )
