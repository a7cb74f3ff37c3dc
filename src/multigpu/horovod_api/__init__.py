"""Horovod's PyTorch API, as a teaching stand-in written over torch.distributed (12).

**What Horovod is.** Horovod (https://github.com/horovod/horovod) is a data-parallel
training library that Uber released in 2017 (A. Sergeev and M. Del Balso, "Horovod:
fast and easy distributed deep learning in TensorFlow", 2018); it is now hosted by
the LF AI & Data Foundation. Its idea is the one of notebooks 07-10: one process per
GPU, each with a copy of the model, and gradients averaged with a ring all-reduce
(its first code came from Baidu's tensorflow-allreduce), over MPI, Gloo or NCCL.
``horovodrun -np 4 python train.py`` starts four processes (``-H host1:4,host2:4``
spreads them over two machines), and a training script changes in a few lines:
``hvd.init()``, ``hvd.DistributedOptimizer(optimizer, ...)``,
``hvd.broadcast_parameters(...)`` and ``hvd.broadcast_optimizer_state(...)``.

**This module is not Horovod.** It is a small stand-in with Horovod's names,
written for this course over ``torch.distributed``, so that a Horovod script runs
here with one line changed::

    import multigpu.horovod_api as hvd   # instead of: import horovod.torch as hvd

and is started with ``torchrun --nproc-per-node=4 train.py``, or from a notebook
with :func:`multigpu.runtime.launch.spawn`. Horovod itself cannot be installed here:
``pip install horovod`` compiles its PyTorch extension from source, and its last
release, 0.28.1 (June 2023), compiles it as C++14, while PyTorch's headers need
C++17 since PyTorch 2.1. Horovod's main branch switched to C++17 in August 2024, but
no release has followed. With a CUDA build of PyTorch the extension also compiles
CUDA code, which needs a CUDA toolkit (``nvcc``) on the machine.

Only Horovod's names are here; :data:`CALL_MAP` maps each to ``torch.distributed``.
Horovod's compression, Adasum, process sets, sparse gradients and ``groups`` are
left out, and :func:`allreduce` does not pass gradients back as Horovod's does.
"""

from multigpu.horovod_api import errors
from multigpu.horovod_api.basics import (
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from multigpu.horovod_api.call_map import CALL_MAP
from multigpu.horovod_api.errors import BackwardPassesError, NotInitializedError
from multigpu.horovod_api.functions import (
    broadcast_optimizer_state,
    broadcast_parameters,
)
from multigpu.horovod_api.ops import Average, Sum, allreduce, allreduce_
from multigpu.horovod_api.optimizer import DistributedOptimizer

__all__ = [
    "CALL_MAP",
    "Average",
    "BackwardPassesError",
    "DistributedOptimizer",
    "NotInitializedError",
    "Sum",
    "allreduce",
    "allreduce_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "errors",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]
