"""A DistributedDataParallel built by hand, in three steps of a ladder (10).

Taught in ``notebooks/10_ddp_by_hand.ipynb``. Notebook 08 averaged the gradients
after ``backward()`` had finished, so every rank sat idle while they travelled.
PyTorch's DDP hides most of that time: it starts all-reducing a *bucket* of
gradients as soon as the last gradient of the bucket has been computed, while
backward goes on with the layers below. Three wrappers climb to that design:

- :class:`AfterBackwardDDP` (``wrappers.py``): once backward has finished, one
  all-reduce per parameter;
- :class:`FlatDDP` (``wrappers.py``): once backward has finished, one all-reduce of
  every gradient packed into one flat buffer;
- :class:`BucketedDDP` (``buckets.py``): PyTorch's design, buckets all-reduced
  with ``async_op=True`` while backward continues.

:class:`MiniDDP` (``wrappers.py``) is what the three share. :func:`make_ddp`
(``ladder.py``) wraps a model by a step's name, :func:`train_with_strategy`
(``loop.py``) trains with it, and with ``record=True`` a wrapper keeps a timeline
of the last step (:class:`TimelineEvent`, ``timeline.py``). A :class:`BucketedDDP`'s
buckets are in its ``.buckets`` (:func:`bucket_layout` gives their names); PyTorch's
DDP shows its own only to a communication hook, which :func:`record_torch_buckets`
registers to log them. The rank functions are in :mod:`multigpu.ranks.miniddp`,
the exercise's checker in :mod:`multigpu.exercises.miniddp`.
"""

from multigpu.miniddp.buckets import (
    Bucket,
    BucketedDDP,
    assign_buckets,
    bucket_layout,
    record_torch_buckets,
)
from multigpu.miniddp.ladder import STRATEGIES, make_ddp
from multigpu.miniddp.loop import global_batch_shares, train_with_strategy
from multigpu.miniddp.models import BranchNet
from multigpu.miniddp.timeline import TimelineEvent, hidden_fraction
from multigpu.miniddp.wrappers import (
    AfterBackwardDDP,
    FlatDDP,
    MiniDDP,
    UnusedParameterError,
    broadcast_from_rank0,
    check_one_dtype,
    copy_from_rank0,
    used_parameters,
)

__all__ = [
    "STRATEGIES",
    "AfterBackwardDDP",
    "BranchNet",
    "Bucket",
    "BucketedDDP",
    "FlatDDP",
    "MiniDDP",
    "TimelineEvent",
    "UnusedParameterError",
    "assign_buckets",
    "broadcast_from_rank0",
    "bucket_layout",
    "check_one_dtype",
    "copy_from_rank0",
    "global_batch_shares",
    "hidden_fraction",
    "make_ddp",
    "record_torch_buckets",
    "train_with_strategy",
    "used_parameters",
]
