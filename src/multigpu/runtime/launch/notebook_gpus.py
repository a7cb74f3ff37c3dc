"""Launching ranks from a notebook on a GPU machine (Kaggle's 2 x T4, Colab, a
rented box): one rank per GPU, and never after the notebook has used CUDA itself.

Why the notebook's own process must not touch CUDA before the ranks start: ranks
started by ``fork`` (``torch.multiprocessing`` with "fork", accelerate's
``notebook_launcher``) cannot use CUDA once their parent has ("Cannot re-initialize
CUDA in forked subprocess"); a CUDA context in the notebook keeps a few hundred MB
of ``cuda:0`` (and whatever tensors it holds there) from rank 0; and
``CUDA_VISIBLE_DEVICES`` set after that is ignored by the notebook's process. The
functions here refuse to start ranks from a process that has initialised CUDA, in
one line that says how to fix it, and count the GPUs without initialising CUDA.
docs/gpu.md shows them on Kaggle and Colab.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from multigpu.runtime.launch.parent import spawn
from multigpu.runtime.launch.torchrun import run_torchrun


class CudaInitialisedError(RuntimeError):
    """The notebook's own process used CUDA before ranks were launched."""


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA (False where torch is not even
    imported: this never initialises it)."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def refuse_if_cuda_initialised() -> None:
    """Raise :class:`CudaInitialisedError` where this process has used CUDA."""
    if cuda_initialised():
        raise CudaInitialisedError(
            "CUDA is already initialised in this notebook's process (a cell used a "
            "GPU): restart the kernel and launch the ranks before any cell "
            "touches CUDA."
        )


def gpu_count() -> int:
    """The CUDA GPUs this process can see, counted without initialising CUDA
    (``torch.cuda.device_count`` does not create a context)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_on_gpus(
    worker: Callable[..., Any], *args: Any, world_size: int | None = None, **options
) -> list[Any]:
    """:func:`~multigpu.runtime.launch.spawn` with one rank per GPU (nccl), after
    checking that this process has not used CUDA; ``world_size`` defaults to the
    GPU count (2 on a machine without GPUs: gloo on the CPU) (docs/gpu.md)."""
    refuse_if_cuda_initialised()
    ranks = world_size if world_size is not None else (gpu_count() or 2)
    return spawn(worker, ranks, *args, **options)


def torchrun_on_gpus(
    module: str, *args: Any, nproc_per_node: int | None = None, **options
) -> str:
    """``torchrun --standalone --nproc-per-node=N -m module args`` with one rank per
    GPU (2 on a machine without GPUs: gloo on the CPU), after the same check; what
    it printed (docs/gpu.md)."""
    refuse_if_cuda_initialised()
    ranks = nproc_per_node if nproc_per_node is not None else (gpu_count() or 2)
    done = run_torchrun(module, ranks, *args, **options)
    return done.stdout
