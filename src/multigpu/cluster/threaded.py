"""Real ranks as threads of one process: the threaded process group (20).

PyTorch's own tests run many ranks inside one process with the "threaded"
backend (``torch/testing/_internal/distributed/multi_threaded_pg.py``): each
thread calls ``init_process_group("threaded", rank=r, ...)``; a collective waits
until every thread has joined it, then computes the result from all their
tensors, so the numbers are exact. ``_install_threaded_pg`` gives each thread its
own copy of c10d's world; ``_set_thread_isolation_mode(True)`` keeps the
functional collectives' work handles per thread (as ``spawn_threads_and_init_comms``
in ``torch/testing/_internal/common_distributed.py`` does). It has no send/recv.

:func:`run_threaded` starts the threads, returns each rank's result in rank order
and turns a rank's exception or a hang into one line; :func:`make_mlp`,
:func:`mlp_data` and :func:`train_sgd` are the model, data and loop that
:mod:`multigpu.ranks.cluster` trains on thread ranks and in one process.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.cluster.fake import TwoLayerMLP
from multigpu.cluster.pin import check_torch_version
from multigpu.core.checks import check_positive_int
from multigpu.runtime.launch import QUICK_TIMEOUT_S


def run_threaded(
    rank_function: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = QUICK_TIMEOUT_S,
) -> list[Any]:
    """Run ``rank_function(rank, world_size, *args)`` on ``world_size`` thread ranks
    of one threaded process group; return the results in rank order (20)."""
    check_torch_version()
    check_positive_int("world_size", world_size)
    from torch.testing._internal.distributed import multi_threaded_pg as threaded

    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def worker(rank: int, store: dist.Store) -> None:
        dist.init_process_group(
            "threaded", rank=rank, world_size=world_size, store=store
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[rank] = rank_function(rank, world_size, *args)
        except BaseException as error:  # one rank's error stops the others
            errors[rank] = error
            threaded.ProcessLocalGroup.exception_handle(error)
        finally:
            dist.destroy_process_group()

    hook = sys.excepthook  # each rank's init_process_group wraps it again
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # DTensor's note on two all-gathers in a row
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    threaded._install_threaded_pg()
    try:
        store = dist.HashStore()
        threads = [
            threading.Thread(target=worker, args=(rank, store), daemon=True)
            for rank in range(world_size)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
        if hung:  # wake the waiting threads, and let them finish
            threaded.ProcessLocalGroup.exception_handle(TimeoutError())
            for rank in hung:
                threads[rank].join(timeout)
    finally:
        threaded._uninstall_threaded_pg()
        threaded.ProcessLocalGroup.reset()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        quiet.setLevel(level)
        sys.excepthook = hook
    if errors and not hung:
        rank = next(iter(errors))  # the first to fail; the others were woken
        error = errors[rank]
        line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise RuntimeError(f"thread rank {rank} failed: {type(error).__name__}: {line}")
    if hung:
        raise RuntimeError(
            f"thread ranks {hung} did not finish within {timeout} s (a collective "
            "that not every rank called?); make every rank call the same collectives."
        )
    return [results[rank] for rank in range(world_size)]


def make_mlp(blocks: int = 2, dim: int = 8, dtype: torch.dtype = torch.float64):
    """``blocks`` :class:`TwoLayerMLP` blocks in a Sequential, seeded (20)."""
    torch.manual_seed(0)
    return nn.Sequential(*(TwoLayerMLP(dim) for _ in range(blocks))).to(dtype)


def mlp_data(dtype: torch.dtype = torch.float64, rows: int = 16, dim: int = 8):
    """Inputs (rows, dim) and targets (rows, dim), seeded (20)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, dim, generator=generator, dtype=dtype)
    return x, torch.randn(rows, dim, generator=generator, dtype=dtype)


def train_sgd(model: nn.Module, x, y, steps: int) -> None:
    """``steps`` SGD steps (lr 0.1) on the mean squared error of ``model(x)`` and
    ``y``; under FSDP2 the mean of each rank's part, averaged over dp (20)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()  # FSDP2 averages over dp parts
        optimizer.step()
