"""The ranks of notebook 14b: FSDP2's knobs, each measured on a rank (14b).

:func:`reshard_rank` (bytes held between forward and backward, collectives
counted), :func:`train_rank` (train under any knobs: mixed precision, HSDP mesh,
accumulation, clipping), :func:`prefetch_rank` (the order of all-gathers and
computation), :func:`meta_init_rank`, :func:`export_rank` (a full state dict
saved by rank 0), :func:`zero_redundancy_rank` (PyTorch's ZeRO-1 beside 13's),
:func:`fully_shard_error_rank` (what FSDP2 refuses), :func:`peak_memory_rank`
(a step's peak, by kind) and :func:`ddp_gradient_copies_rank` (DDP's buckets beside
the gradients). The checkers' rank functions are in
:mod:`multigpu.ranks.fsdp2_exercises`.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.train import TrainConfig
from multigpu.fsdp2 import (
    CollectiveLog,
    MicroBatch,
    build_on_meta,
    cpu_mesh,
    full_parameters,
    full_state_dict,
    layers_to_shard,
    load_full_state_dict,
    local_parameter_bytes,
    make_optimizer,
    parameter_bytes_held,
    rank_part,
    set_prefetch,
    shard_layers,
    train_steps,
)
from multigpu.fsdp2.memory import (
    budget_model,
    shard_blocks,
    step_peak,
    unsharded_gradient_bytes,
)
from multigpu.zero import train_stage


def _policy(mixed: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not mixed:
        return {}
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32
    )
    return {"mp_policy": policy}


def _my_steps(steps, rank, world_size) -> list[list[MicroBatch]]:
    return [[rank_part(m, rank, world_size) for m in step] for step in steps]


def reshard_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    batch: MicroBatch,
    settings: Sequence[tuple[bool | int, bool]],
) -> list[dict[str, Any]]:
    """Rank function: for each (reshard_after_forward, mixed) of ``settings``, shard
    a copy of ``model``, run one forward and backward on this rank's part of
    ``batch``: the parameter bytes held after forward, the collectives of forward
    and of backward, and each unit's parameter shapes (14b)."""
    rows = []
    inputs, labels = rank_part(batch, rank, world_size)
    for reshard, mixed in settings:
        sharded = shard_layers(model, reshard_after_forward=reshard, **_policy(mixed))
        with CollectiveLog(sharded) as log:
            loss = nn.functional.cross_entropy(sharded(inputs), labels)
            held = parameter_bytes_held(sharded)
            forward = list(log.calls)
            log.clear()
            loss.backward()
            backward = list(log.calls)
        layers = layers_to_shard(sharded)
        in_layers = {p for layer in layers for p in layer.parameters()}
        shapes = [[tuple(p.shape) for p in layer.parameters()] for layer in layers]
        shapes.append(
            [tuple(p.shape) for p in sharded.parameters() if p not in in_layers]
        )
        rows.append(
            {
                "reshard_after_forward": reshard,
                "mixed": mixed,
                "held": held,
                "forward": forward,
                "backward": backward,
                "unit shapes": shapes,  # the root's last: those of no layer
            }
        )
    return rows


def train_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    lr: float,
    knobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Rank function: shard a copy of ``model`` and train it on this rank's parts of
    the global ``steps`` (:func:`~multigpu.fsdp2.train_steps`); ``model`` may be a
    list, every rank's own (rank 0's is broadcast). ``knobs``:
    "mesh" (a shape, e.g. (2, 2) for HSDP), "mixed" (bf16 parameters, fp32
    reductions), "reshard_after_forward", "prefetch" (a depth), "max_norm",
    "optimizer" ("adam" or "sgd"), "reshard_after_backward" (False: keep the
    parameters whole between a step's micro-batches). Returns the StepsResult's
    fields, the collectives counted, the parameter bytes this rank stores, the
    unsharded gradients and parameters held after each micro-batch but the last,
    and the mesh's groups (14b)."""
    knobs = dict(knobs or {})
    model = model[rank] if isinstance(model, list) else model  # rank 0's is used
    mesh_shape = knobs.get("mesh")
    names = ("replicate", "shard") if mesh_shape and len(mesh_shape) == 2 else None
    options = _policy(knobs.get("mixed", False))
    if "reshard_after_forward" in knobs:
        options["reshard_after_forward"] = knobs["reshard_after_forward"]
    mesh = cpu_mesh(mesh_shape, names)
    sharded = shard_layers(model, mesh, **options)
    set_prefetch(layers_to_shard(sharded), knobs.get("prefetch", 0))
    optimizer = make_optimizer(sharded, lr, knobs.get("optimizer", "adam"))
    mine = _my_steps(steps, rank, world_size)
    between = []  # after each micro-batch's backward but a step's last

    def before_micro_batch(step: int, micro: int) -> None:
        if micro > 0:
            gradients = unsharded_gradient_bytes(sharded)
            held = parameter_bytes_held(sharded)["unsharded"]
            between.append({**gradients, "parameter bytes": held})
        if knobs.get("reshard_after_backward", True) is False:
            sharded.set_reshard_after_backward(micro == len(mine[step]) - 1)

    with CollectiveLog(sharded) as log:
        result = train_steps(
            sharded, mine, optimizer, knobs.get("max_norm"), before_micro_batch
        )
    kinds = ("all-gather", "reduce-scatter", "all-reduce")
    return {
        "losses": result.losses,
        "norms": result.norms,
        "norm types": result.norm_types,
        "parameters": result.parameters,
        "counts": {kind: log.count(kind) for kind in kinds},
        "group sizes": {
            kind: sorted({c["group size"] for c in log.calls if c["kind"] == kind})
            for kind in kinds
        },
        "all-gather dtypes": sorted(
            {c["dtype"] for c in log.calls if c["kind"] == "all-gather"}
        ),
        "reduce-scatter dtypes": sorted(
            {c["dtype"] for c in log.calls if c["kind"] == "reduce-scatter"}
        ),
        "stored bytes": parameter_bytes_held(sharded)["sharded"],
        "placements": {n: str(p.placements) for n, p in sharded.named_parameters()},
        "between micro-batches": between,
        "mesh": mesh.mesh.tolist(),
        "groups": {
            name: dist.get_process_group_ranks(mesh.get_group(name))
            for name in names or ()
        },
    }


def prefetch_rank(
    rank: int, world_size: int, model: nn.Module, batch: MicroBatch, depth: int
) -> dict[str, list[str]]:
    """Rank function: one forward and one backward at prefetch ``depth``, each as
    a sequence of events, "all-gather <unit>" when a unit's all-gather is issued
    and "compute <unit>" when its forward (or backward) starts (14b)."""
    sharded = shard_layers(model)
    units = layers_to_shard(sharded)
    set_prefetch(units, depth)
    names = {id(module): name for name, module in sharded.named_modules()}
    inputs, labels = rank_part(batch, rank, world_size)
    with CollectiveLog(sharded) as log:
        for unit in units:  # after FSDP2's own pre-forward hook: parameters ready
            unit.register_forward_pre_hook(
                lambda module, args: log.mark(f"compute {names[id(module)]}")
            )
        loss = nn.functional.cross_entropy(sharded(inputs), labels)
        forward = list(log.events)
        log.clear()
        loss.backward()
    return {"forward": forward, "backward": list(log.events)}


def meta_init_rank(
    rank: int, world_size: int, build: Callable[[], nn.Module], seed: int
) -> dict[str, Any]:
    """Rank function: ``build()`` on the meta device, sharded, ``to_empty`` and
    ``reset_parameters`` under ``seed``: the bytes stored before and after, whether
    the weights equal ``build()`` in one process under the same seed, whether
    every rank drew the same rows, PyTorch's warnings; then the one-process weights
    broadcast from rank 0 into the shards
    (:func:`~multigpu.fsdp2.load_full_state_dict`) (14b)."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        empty = build()
    torch.manual_seed(seed)
    with warnings.catch_warnings(record=True) as caught:  # returned, not printed
        warnings.simplefilter("always")
        model = build_on_meta(build)
    torch.manual_seed(seed)
    reference = build()  # what one process builds
    reset = full_parameters(model)
    name, first = next(iter(model.named_parameters()))
    rows = reset[name].chunk(world_size)  # rank r's rows, as FSDP2 cuts them
    wanted = reference.state_dict() if rank == 0 else {}
    load_full_state_dict(model, wanted)
    loaded = full_parameters(model)
    same = {n: torch.equal(reset[n], p) for n, p in reference.named_parameters()}
    return {
        "meta bytes": local_parameter_bytes(empty),
        "stored bytes": parameter_bytes_held(model)["sharded"],  # padded shards
        "whole bytes": local_parameter_bytes(reference),
        "reset equals one process": same,
        "ranks drew the same rows": torch.equal(rows[0], rows[1]),
        "warnings": sorted({str(w.message) for w in caught}),
        "loaded equals one process": all(
            torch.equal(loaded[n], p) for n, p in reference.named_parameters()
        ),
    }


def export_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    lr: float,
    path: str,
) -> dict[str, Any]:
    """Rank function: train an FSDP2 copy of ``model``, then gather its full state
    dict (on rank 0 only, in CPU memory) and save it with ``torch.save`` from
    rank 0 to ``path``. Returns what this rank's dict held (14b)."""
    sharded = shard_layers(model)
    optimizer = make_optimizer(sharded, lr)
    result = train_steps(sharded, _my_steps(steps, rank, world_size), optimizer)
    state = full_state_dict(sharded)
    if rank == 0:
        torch.save(state, path)
    return {
        "keys": sorted(state),
        "types": sorted({type(v).__name__ for v in state.values()}),
        "devices": sorted({str(v.device) for v in state.values()}),
        "parameters": result.parameters,
    }


def zero_redundancy_rank(
    rank: int,
    world_size: int,
    model: nn.Module,
    steps: Sequence[Sequence[MicroBatch]],
    lr: float,
    find_unused_parameters: bool = False,
) -> dict[str, Any]:
    """Rank function: PyTorch's ZeRO-1, DDP with
    ``torch.distributed.optim.ZeroRedundancyOptimizer`` (Adam), and 13's ZeRO-1
    (:func:`~multigpu.zero.train_stage`) on the same batches: both full weights
    and the bytes of Adam state this rank keeps under each (14b).
    ``find_unused_parameters``: for a model with a layer unused in forward."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = nn.parallel.DistributedDataParallel(
        copy.deepcopy(model), find_unused_parameters=find_unused_parameters
    )
    trainable = [p for p in ddp.parameters() if p.requires_grad]
    optimizer = ZeroRedundancyOptimizer(
        trainable, optimizer_class=torch.optim.Adam, lr=lr
    )
    mine = _my_steps(steps, rank, world_size)
    result = train_steps(ddp, mine, optimizer)
    state = optimizer.optim.state.values()  # this rank's partition only
    adam_bytes = sum(
        t.numel() * t.element_size()
        for s in state
        for key, t in s.items()
        if key in ("exp_avg", "exp_avg_sq")
    )
    batches = [micro for step in mine for micro in step]  # one micro-batch per step
    by_hand = train_stage(
        "ZeRO-1", model, None, None, TrainConfig(lr=lr), batches=batches
    )
    return {
        "torch": {k.removeprefix("module."): v for k, v in result.parameters.items()},
        "torch adam bytes": adam_bytes,
        "13": by_hand.parameters,
        "13 adam bytes": by_hand.ledger["optimizer"],
    }


def fully_shard_error_rank(
    rank: int, world_size: int, model: nn.Module, first: str, second: str
) -> str:
    """Rank function: ``fully_shard`` on the layers named ``first`` and ``second``
    separately (a weight tied between them), then on the model, and one forward:
    FSDP2's error, as "ExceptionName: message", or "ran" (14b)."""
    from torch.distributed.fsdp import fully_shard

    mesh = cpu_mesh()
    model = copy.deepcopy(model)
    try:
        fully_shard(model.get_submodule(first), mesh=mesh)
        fully_shard(model.get_submodule(second), mesh=mesh)
        fully_shard(model, mesh=mesh)
        weight = next(model.parameters())
        model(torch.zeros(1, weight.shape[1], dtype=weight.dtype))
    except Exception as error:  # the point: show FSDP2's own message
        return f"{type(error).__name__}: {error}"
    return "ran"


def peak_memory_rank(
    rank: int,
    world_size: int,
    sizes: Sequence[int],
    batch: MicroBatch,
    settings: Sequence[dict[str, Any]],
) -> list[dict[str, int]]:
    """Rank function: for each setting ({"mixed": bool, "reshard_after_forward",
    "checkpoint_blocks": bool}), :func:`~multigpu.fsdp2.memory.budget_model` of
    ``sizes`` sharded by :func:`~multigpu.fsdp2.memory.shard_blocks`, one SGD
    step on this rank's part of ``batch``: the peak bytes by kind (14b)."""
    mine = [tuple(t.clone() for t in rank_part(batch, rank, world_size))]
    peaks = []
    for setting in settings:
        options = {k: v for k, v in setting.items() if k != "mixed"}
        options.update(_policy(setting.get("mixed", False)))
        model = shard_blocks(budget_model(sizes), cpu_mesh(), **options)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        peaks.append(step_peak(model, optimizer, mine))
    return peaks


def ddp_gradient_copies_rank(
    rank: int, world_size: int, model: nn.Module, batch: MicroBatch
) -> list[dict[str, Any]]:
    """Rank function: one backward of DDP over a copy of ``model`` with
    ``gradient_as_bucket_view`` False (DDP's default), then True, a comm hook
    recording the buckets it all-reduces: the bytes of the parameters, of the
    ``.grad`` tensors, of the buckets and of all the memory holding gradients
    (14b)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
        allreduce_hook,
    )

    def storages(tensors: Any) -> dict[int, int]:
        return {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in tensors
        }

    def recording_hook(buckets, bucket):  # DDP refuses any other annotation
        buckets.append(bucket.buffer())  # the bucket itself, not a copy
        return allreduce_hook(None, bucket)  # None: the default group

    rows = []
    for as_view in (False, True):
        ddp = nn.parallel.DistributedDataParallel(
            copy.deepcopy(model), gradient_as_bucket_view=as_view
        )
        buckets = []
        ddp.register_comm_hook(buckets, recording_hook)  # its state: our list
        inputs, labels = rank_part(batch, rank, world_size)
        nn.functional.cross_entropy(ddp(inputs), labels).backward()
        grads = storages(p.grad for p in ddp.parameters())
        in_buckets = storages(buckets)
        rows.append(
            {
                "gradient_as_bucket_view": as_view,
                "parameters": sum(p.nbytes for p in ddp.parameters()),
                "gradients": sum(grads.values()),
                "buckets": sum(in_buckets.values()),
                "holding gradients": sum({**grads, **in_buckets}.values()),
            }
        )
    return rows
