"""Rank functions only the tests use: ranks that fail, hang, are killed, or take a
wrong training step (the mistakes the exercise checkers must catch). The test files
beside this one test src/multigpu/ranks/ and these functions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from multigpu.ranks.collectives import sum_of_ranks_rank

# ----------------------------------------------------------------------------------
# Ranks that misbehave (tests of multigpu.runtime.launch)


def environment_value_rank(rank: int, world_size: int, name: str) -> str | None:
    """The value of environment variable ``name`` in this rank (tests of launch)."""
    return os.environ.get(name)


def group_made_while_a_rank_sleeps_rank(
    rank: int, world_size: int, late_rank: int, delay_s: float
) -> tuple[float, float]:
    """Every rank makes the group of ranks 0 and 1, ``late_rank`` (not in it) only
    after ``delay_s``: (when this rank called new_group, when it returned), on the
    clock all ranks share (tests of launch)."""
    if rank == late_rank:
        time.sleep(delay_s)
    called = time.time()
    dist.new_group([0, 1])
    return called, time.time()


def modules_a_training_step_imports_rank(rank: int, world_size: int) -> list[str]:
    """The modules that building an optimizer and taking one step import in this
    rank, sorted (tests of launch: the forkserver should have imported them)."""
    before = set(sys.modules)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    return sorted(set(sys.modules) - before)


def wait_for_each_other_rank(rank: int, world_size: int) -> int:
    """Every rank waits to receive from its neighbour and none sends: all time out
    (tests of launch)."""
    incoming = torch.zeros(1)
    dist.recv(incoming, src=(rank + 1) % world_size)
    return int(incoming.item())


def fail_while_peer_waits_on_a_receive_rank(rank: int, world_size: int) -> None:
    """Rank 1 fails at once; rank 0 waits on ``irecv(...).wait()`` from it, which
    gloo ends with "Connection closed by peer" (tests of launch)."""
    if rank == 1:
        raise ValueError("rank 1's own mistake")
    dist.irecv(torch.zeros(1), src=1).wait()


def close_then_fail_slowly_rank(rank: int, world_size: int) -> None:
    """Rank 1 closes its connections (rank 0, waiting on a receive from it, sees
    "Connection closed by peer" at once), then takes 1.5 s to raise its own error,
    as a rank under load may take to report (tests of launch)."""
    if rank == 1:
        dist.destroy_process_group()
        time.sleep(1.5)
        raise ValueError("rank 1's own mistake, reported late")
    dist.irecv(torch.zeros(1), src=1).wait()


def time_out_while_peer_waits_longer_rank(rank: int, world_size: int) -> None:
    """Rank 1 waits in an all_reduce rank 0 never joins and times out (the group's
    timeout); rank 0 waits 30 s on a receive and sees rank 1's connection close
    (tests of launch)."""
    if rank == 1:
        dist.all_reduce(torch.zeros(1))
    else:
        dist.irecv(torch.zeros(1), src=1).wait(timedelta(seconds=30))


def start_sleeper_then_fail_rank(rank: int, world_size: int, pid_file: str) -> None:
    """Start a long-sleeping subprocess, record its pid in ``pid_file``, then raise
    (tests of launch)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(f"{pid_file}.{rank}", "w") as handle:
        handle.write(str(sleeper.pid))
    raise RuntimeError(f"rank {rank} failed after starting a subprocess")


def unpicklable_result_rank(rank: int, world_size: int):
    """Returns something that cannot be sent back to the parent, a generator (tests
    of launch)."""
    return (i for i in range(3))


def join_late_rank(rank: int, world_size: int, late_rank: int, delay_s: float) -> int:
    """Rank ``late_rank`` sleeps ``delay_s`` seconds before it joins the all_reduce:
    the others wait for it (tests of launch)."""
    if rank == late_rank:
        time.sleep(delay_s)
    return sum_of_ranks_rank(rank, world_size)


def exit_without_returning_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` ends its own process with ``os._exit(0)``: it neither
    returns nor raises (tests of launch)."""
    if rank == bad_rank:
        os._exit(0)
    return rank


class UnprintableError(Exception):
    """An exception whose text cannot be made: ``str()`` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be turned into text")


def raise_unprintable_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises an :class:`UnprintableError` (tests of launch)."""
    if rank == bad_rank:
        raise UnprintableError()
    return rank


def _refuse_to_unpickle() -> None:
    raise ValueError("this object cannot be rebuilt outside the rank")


class RefusesToUnpickle:
    """Pickles without complaint, but unpickling it raises ValueError."""

    def __reduce__(self):
        return (_refuse_to_unpickle, ())


def result_that_fails_to_unpickle_rank(rank: int, world_size: int, bad_rank: int):
    """Rank ``bad_rank`` returns a :class:`RefusesToUnpickle`, which the parent
    cannot unpickle; the others return their rank (tests of launch)."""
    return RefusesToUnpickle() if rank == bad_rank else rank


def mismatched_shapes_rank(rank: int, world_size: int) -> list[float]:
    """Each rank all-reduces a tensor of a different size, 4 * (rank + 1) elements:
    gloo aborts the process that receives more than it expects (tests of launch)."""
    tensor = torch.zeros(4 * (rank + 1))
    dist.all_reduce(tensor)
    return tensor.tolist()


# ----------------------------------------------------------------------------------
# Training steps for multigpu.exercises.allreduce_sgd.check_step: one written by hand
# as notebook 08's exercise asks, and mistakes it must name. Each has sgd_step's
# signature; ``config`` (a TrainConfig) is not used. (tests of allreduce_sgd)


def step_all_reducing_each_gradient(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Correct: one ``dist.all_reduce`` per gradient, then divide by the world size."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)  # mean over this batch
    loss.backward()
    if distributed:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  # the sum over the ranks
            parameter.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def step_without_all_reduce(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: every rank steps with its own gradient, so the ranks drift apart."""
    return step_all_reducing_each_gradient(model, optimizer, X, y, config)


def step_summing_without_dividing(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: the gradients are summed over the ranks but never divided."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    if distributed:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
    optimizer.step()
    return loss.item()


def step_returning_the_ranks_summed_loss(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: trains correctly, but returns the loss summed over the ranks."""
    loss = step_all_reducing_each_gradient(model, optimizer, X, y, config, distributed)
    if not distributed:
        return loss
    total = torch.tensor([loss])
    dist.all_reduce(total)
    return total.item()


# ----------------------------------------------------------------------------------
# Synchronized BatchNorm (tests of multigpu.syncbn)


def forward_backward_rank(
    rank: int,
    world_size: int,
    x: torch.Tensor,
    layer: torch.nn.Module,
    sizes: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Rank r takes its slice of the global batch ``x`` (B, C, ...): ``sizes[r]``
    samples (the slices in rank order; 0 allowed), or with ``sizes=None`` the r-th
    of ``x.chunk(world_size)``. It runs ``layer`` (a BatchNorm) in training mode and
    backward of the sum of squared outputs of the whole batch; returns its output,
    its input gradient, the layer's weight gradient summed over the ranks and its
    running statistics (tests of syncbn).

    Under nccl the tensors go to this rank's GPU (for ``nn.SyncBatchNorm``)."""
    import copy

    if sizes is None:
        chunk = x.chunk(world_size)[rank]
    elif len(sizes) != world_size or sum(sizes) != len(x) or min(sizes) < 0:
        raise ValueError(
            f"sizes={list(sizes)} do not split a batch of {len(x)} over "
            f"{world_size} ranks. Pass one size per rank, each >= 0, summing to "
            f"{len(x)}."
        )
    else:
        chunk = x.split(list(sizes))[rank]
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    layer = copy.deepcopy(layer).to(device).train()
    chunk = chunk.to(device).requires_grad_(True)
    out = layer(chunk)
    (out * out).sum().backward()
    weight_grad = layer.weight.grad.clone()
    dist.all_reduce(weight_grad)
    return {
        "out": out.detach().cpu(),
        "grad": chunk.grad.cpu(),
        "weight grad": weight_grad.cpu(),
        "running_mean": layer.running_mean.cpu(),
        "running_var": layer.running_var.cpu(),
    }


def ddp_from_seed_rank(
    rank: int,
    world_size: int,
    build,
    dtype: torch.dtype,
    seed: int,
    X: torch.Tensor,
    y: torch.Tensor,
    config,
    options: dict,
) -> dict:
    """Build the model with ``build(dtype, seed + rank)`` (so the ranks may start
    from different weights) and train it with :func:`multigpu.ddp.train_ddp_loop`.
    Returns {"history", "differed before"}; a ``RuntimeError`` or ``ValueError``
    the training raises comes back as {"error": its text} (tests/ddp's hard cases)."""
    from multigpu.ddp import train_ddp_loop

    model = build(dtype, seed + rank)
    flat = torch.cat([t.flatten().double() for t in model.state_dict().values()])
    gathered = [torch.zeros_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    differed = any(not torch.equal(t, gathered[0]) for t in gathered[1:])
    try:
        history = train_ddp_loop(
            model, X, y, config, progress=False, log=None, **options
        )
    except (RuntimeError, ValueError) as error:
        return {"error": str(error), "differed before": differed}
    return {"history": history, "differed before": differed}


# ----------------------------------------------------------------------------------
# Hard cases (tests/hard_cases.py) for allreduce_sgd and horovod_api: ranks that
# build their model from their own seed (tests of allreduce_sgd and horovod_api)


def train_loop_from_own_seed_rank(
    rank: int, world_size: int, build, seed: int, X, y, config
):
    """Build the model with ``build(seed=seed + rank)``, then train it with
    :func:`multigpu.allreduce_sgd.train_loop` (tests of allreduce_sgd)."""
    from multigpu.allreduce_sgd import train_loop

    model = build(seed=seed + rank)
    return train_loop(model, X, y, config, rank, world_size, True)


def horovod_from_own_seed_rank(
    rank: int, world_size: int, build, seed: int, X, y, config
):
    """Build the model with ``build(seed=seed + rank)``, then train it as a Horovod
    script (which broadcasts rank 0's weights) (tests of horovod_api)."""
    from multigpu.ranks.horovod_api import train_horovod_style_rank

    model = build(seed=seed + rank)
    return train_horovod_style_rank(
        rank, world_size, model, X, y, config, different_start=False
    )


# ----------------------------------------------------------------------------------
# Hard cases (tests/hard_cases.py) for miniddp: ranks that build their model from
# their own seed, refusals, and PyTorch DDP's own record of its buckets


def miniddp_from_own_seed_rank(
    rank: int,
    world_size: int,
    build,
    seed: int,
    X,
    y,
    config,
    strategies: tuple[str, ...],
    options: dict,
    accumulation: int = 1,
):
    """Build the model with ``build(seed=seed + rank)``, then train it with
    :func:`multigpu.miniddp.train_with_strategy` once per strategy (tests of
    miniddp)."""
    from multigpu.miniddp import train_with_strategy

    model = build(seed=seed + rank)
    return {
        strategy: train_with_strategy(
            model, X, y, config, strategy, options, accumulation
        )
        for strategy in strategies
    }


def miniddp_error_rank(
    rank: int, world_size: int, model, strategy: str, options: dict, X, y, steps=2
):
    """Wrap ``model`` with ``strategy`` and take ``steps`` SGD steps; the error that
    stopped it ({"step": -1 at construction, "error", "message"}), or None (tests of
    miniddp)."""
    from multigpu.miniddp import make_ddp

    step = -1
    try:
        wrapped = make_ddp(model, strategy, **options)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        for step in range(steps):  # noqa: B007 (the except reports it)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(wrapped(X), y).backward()
            optimizer.step()
    except (RuntimeError, TypeError, ValueError) as error:
        return {"step": step, "error": type(error).__name__, "message": str(error)}
    return None


def torch_ddp_buckets_rank(
    rank: int, world_size: int, model, bucket_cap_mb: float, X, steps: int = 3
):
    """What :func:`multigpu.miniddp.record_torch_buckets` logged over ``steps``
    steps of PyTorch's DDP, next to DDP's own logging data after them (its bucket
    sizes and rebuilt buckets), the parameter names in DDP's order, and the final
    weights (tests of miniddp)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from multigpu.core.train import cpu_state_dict
    from multigpu.miniddp import record_torch_buckets

    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    log = record_torch_buckets(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        ddp(X).sum().backward()
        optimizer.step()
    ddp(X)  # DDP's logging data is updated in forward
    data = ddp._get_ddp_logging_data()
    return {
        "log": log,
        "logged": {k: v for k, v in data.items() if "bucket" in k},
        "names": [n for n, p in model.named_parameters() if p.requires_grad],
        "parameters": cpu_state_dict(ddp.module),
    }


def seeded_snapshot_rank(rank: int, world_size: int, *args):
    """``snapshot_rank`` in a process whose generators start as a new process's
    do (seeded 0), so that runs in one launch start alike (tests of snapshot)."""
    import random

    import numpy as np

    from multigpu.ranks.snapshot import snapshot_rank

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    return snapshot_rank(rank, world_size, *args)
