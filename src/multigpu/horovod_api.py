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

**How it maps** (:data:`CALL_MAP` holds the same as rows for a table):

- ``horovodrun -np 4 python train.py``: ``torchrun --nproc-per-node=4 train.py``;
- ``hvd.init()``: ``dist.init_process_group`` from torchrun's environment
  (:func:`multigpu.ddp.setup`); a process group that exists already is used;
- ``hvd.rank()``, ``hvd.size()``: ``dist.get_rank()``, ``dist.get_world_size()``;
  ``hvd.local_rank()``, ``hvd.local_size()``: torchrun's ``LOCAL_RANK`` and
  ``LOCAL_WORLD_SIZE`` environment variables;
- ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``: ``dist.broadcast``
  of every tensor, what DDP does when it is built;
- ``hvd.broadcast_optimizer_state(optimizer, root_rank=0)``: the root's
  ``optimizer.state_dict()`` sent with ``dist.broadcast_object_list``;
- ``hvd.DistributedOptimizer``: ``DistributedDataParallel``. Horovod hooks the
  optimizer's parameters, DDP wraps the model; both start all-reducing gradients
  while backward is still running;
- ``hvd.allreduce(t)``: ``dist.all_reduce(t)`` (a sum), then divide by the size;
- Horovod's *tensor fusion* (``HOROVOD_FUSION_THRESHOLD``: 128 MB by default, 64 MB
  before 0.21): DDP's buckets (``bucket_cap_mb``, 25 MB by default);
- ``backward_passes_per_step=k``: ``k - 1`` backward passes inside DDP's
  ``no_sync()``.

**Where it differs from Horovod.** Horovod sends each gradient's all-reduce to a
background thread; every cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default, 5 ms
before 0.21) the ranks agree, rank 0 coordinating, which tensors are ready on all of
them, and those are fused into one buffer of at most the threshold. Here there is
no thread and no clock: gradients go into a fusion buffer in the order backward
produces them, and a buffer is sent when the next gradient would not fit. So, as
with DDP, every rank must compute the same parameters' gradients in the same order
(the same model; a parameter without a gradient is sent as zeros at the end).
Horovod's compression, Adasum, process sets, sparse gradients and ``groups`` are
left out, and :func:`allreduce` does not pass gradients back as Horovod's does.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.allreduce_sgd import epoch_means, per_rank_batch_size, run_batches
from multigpu.core.checks import check_choice, check_number, check_positive_int
from multigpu.core.train import History, TrainConfig, cpu_state_dict
from multigpu.ddp import (
    ENV_NAMES,
    NotLaunchedByTorchrunError,
    rank_device,
    reduce_value,
    setup,
)
from multigpu.miniddp import MB

Average = "average"  # op=hvd.Average: the sum over the ranks divided by their number
Sum = "sum"  # op=hvd.Sum: the sum over the ranks
OPS = (Average, Sum)
FUSION_THRESHOLD_MB = 128.0  # Horovod's default since 0.21 (64 MB before)

# One row per Horovod call: Horovod's, what PyTorch writes instead, what this module
# does. For a table in the notebook.
CALL_MAP: list[dict[str, str]] = [
    {
        "horovod": "horovodrun -np 4 python train.py",
        "torch.distributed": "torchrun --nproc-per-node=4 train.py",
        "here": "torchrun, or launch.spawn in a notebook, starts the ranks",
    },
    {
        "horovod": "hvd.init()",
        "torch.distributed": "dist.init_process_group(backend)",
        "here": "init(): ddp.setup() under torchrun; an existing group is used",
    },
    {
        "horovod": "hvd.rank(), hvd.size()",
        "torch.distributed": "dist.get_rank(), dist.get_world_size()",
        "here": "rank(), size()",
    },
    {
        "horovod": "hvd.local_rank(), hvd.local_size()",
        "torch.distributed": "the LOCAL_RANK and LOCAL_WORLD_SIZE environment "
        "variables (set by torchrun)",
        "here": "local_rank(), local_size(): those, else rank() and size()",
    },
    {
        "horovod": "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
        "torch.distributed": "dist.broadcast(t, src=0) for every tensor (what DDP "
        "does when it is built)",
        "here": "broadcast_parameters(): one async broadcast per tensor, then wait",
    },
    {
        "horovod": "hvd.broadcast_optimizer_state(optimizer, root_rank=0)",
        "torch.distributed": "dist.broadcast_object_list([optimizer.state_dict()], "
        "src=0), then load_state_dict",
        "here": "broadcast_optimizer_state(): the root's whole state_dict",
    },
    {
        "horovod": "hvd.DistributedOptimizer(optimizer, "
        "named_parameters=model.named_parameters())",
        "torch.distributed": "DistributedDataParallel(model): DDP wraps the model, "
        "Horovod hooks the optimizer's parameters",
        "here": "DistributedOptimizer: gradient hooks fill fusion buffers, each sent "
        "with dist.all_reduce(async_op=True)",
    },
    {
        "horovod": "hvd.allreduce(t, op=hvd.Average)",
        "torch.distributed": "dist.all_reduce(t) (a sum), then t / world_size",
        "here": "allreduce() (a new tensor), allreduce_() (in place)",
    },
    {
        "horovod": "tensor fusion: HOROVOD_FUSION_THRESHOLD (128 MB; 64 MB before "
        "0.21), HOROVOD_CYCLE_TIME (1 ms)",
        "torch.distributed": "DDP's buckets: bucket_cap_mb (25 MB)",
        "here": "DistributedOptimizer(fusion_threshold_mb=128): by size only, no cycle",
    },
    {
        "horovod": "hvd.DistributedOptimizer(..., backward_passes_per_step=k)",
        "torch.distributed": "k - 1 backward passes inside model.no_sync()",
        "here": "backward_passes_per_step=k: all-reduce after every k-th backward",
    },
    {
        "horovod": "hvd.shutdown()",
        "torch.distributed": "dist.destroy_process_group()",
        "here": "shutdown(): destroys the group only if init() created it",
    },
]


class NotInitializedError(ValueError):
    """A function of this module was called before :func:`init` (a ValueError,
    like Horovod's) (12)."""


class BackwardPassesError(RuntimeError):
    """Backward ran more or fewer times than ``backward_passes_per_step`` before
    ``step()``, or ``zero_grad()`` came between backward and ``step()`` (12)."""


@dataclass
class _State:
    initialized: bool = False  # init() was called in this process
    owns_group: bool = False  # init() created the process group, shutdown() ends it


_state = _State()


def init() -> None:
    """Join the process group: create it from torchrun's environment if it does
    not exist yet, else use it (as in a worker of :func:`multigpu.runtime.launch.spawn`)
    (12)."""
    if not dist.is_initialized():
        missing = [name for name in ENV_NAMES if name not in os.environ]
        if missing:
            raise NotLaunchedByTorchrunError(
                f"hvd.init() found no process group, and {', '.join(missing)} are "
                "not set: the ranks were not started by torchrun, which plays "
                "horovodrun's part here. Start the script with `torchrun "
                "--nproc-per-node=N train.py` (for `horovodrun -np N python "
                "train.py`), or call hvd.init() in a worker started by "
                "multigpu.runtime.launch.spawn."
            )
        setup()  # gloo on CPU, nccl with one GPU per rank
        _state.owns_group = True
    _state.initialized = True


def is_initialized() -> bool:
    """Whether :func:`init` was called and its process group still exists (12)."""
    return _state.initialized and dist.is_initialized()


def shutdown() -> None:
    """Undo :func:`init`: destroy the process group if init created it (a group
    made by spawn stays for spawn to end) (12)."""
    if _state.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _state.initialized = _state.owns_group = False


def _require_init(call: str) -> None:
    """Raise if ``hvd.<call>()`` cannot run: no init(), or no process group."""
    if not _state.initialized:
        raise NotInitializedError(
            f"hvd.{call}() was called before hvd.init(), so there is no process "
            "group to ask. Call hvd.init() first, once at the start of the script "
            "(in a worker of multigpu.runtime.launch.spawn too)."
        )
    if not dist.is_initialized():
        raise NotInitializedError(
            f"hvd.{call}() was called after the process group was destroyed. Call "
            "hvd.init() again, or call it before hvd.shutdown()."
        )


def rank() -> int:
    """This process's rank, 0 to size() - 1 over all machines (12)."""
    _require_init("rank")
    return dist.get_rank()


def size() -> int:
    """The number of processes over all machines (12)."""
    _require_init("size")
    return dist.get_world_size()


def local_rank() -> int:
    """This process's number on its machine, the GPU it uses: torchrun's
    ``LOCAL_RANK``, else :func:`rank` (all ranks on one machine) (12)."""
    _require_init("local_rank")
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def local_size() -> int:
    """The number of processes on this machine: torchrun's ``LOCAL_WORLD_SIZE``,
    else :func:`size` (12)."""
    _require_init("local_size")
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))


def allreduce_(
    tensor: torch.Tensor, op: str = Average, name: str | None = None
) -> torch.Tensor:
    """Replace ``tensor`` by its sum (``Sum``) or mean (``Average``) over the ranks,
    in place, and return it. ``name`` is accepted for Horovod's signature: Horovod
    matches tensors across ranks by name, torch.distributed by call order (12)."""
    _require_init("allreduce_")
    check_choice("op", op, OPS)
    dist.all_reduce(tensor)  # a sum
    if op == Average:
        tensor.div_(dist.get_world_size())
    return tensor


def allreduce(
    tensor: torch.Tensor, op: str = Average, name: str | None = None
) -> torch.Tensor:
    """The sum (``Sum``) or mean (``Average``) of ``tensor`` over the ranks, as a
    new tensor; ``tensor`` is not changed (12)."""
    _require_init("allreduce")
    check_choice("op", op, OPS)
    return reduce_value(tensor, average=op == Average)


def _check_root(root_rank: int) -> None:
    """Raise unless ``root_rank`` is a rank of the group."""
    if not (isinstance(root_rank, int) and 0 <= root_rank < dist.get_world_size()):
        raise ValueError(
            f"root_rank={root_rank!r} is not a rank of this group of "
            f"{dist.get_world_size()}. Pass a rank from 0 to "
            f"{dist.get_world_size() - 1}, usually root_rank=0."
        )


def broadcast_parameters(
    params: dict[str, torch.Tensor] | Iterable[Any], root_rank: int
) -> None:
    """Overwrite every tensor with the root's, in place: ``model.state_dict()``
    (sorted by name, as Horovod does), ``model.named_parameters()`` or
    ``model.parameters()``. All broadcasts start, then all are waited for (12)."""
    _require_init("broadcast_parameters")
    _check_root(root_rank)
    if isinstance(params, dict):
        tensors = [tensor for _, tensor in sorted(params.items())]
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    works = [dist.broadcast(t.detach(), src=root_rank, async_op=True) for t in tensors]
    for work in works:
        work.wait()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer | DistributedOptimizer, root_rank: int
) -> None:
    """Give every rank the root's optimizer state (momentum buffers, Adam's
    moments, step counts) and hyper-parameters (lr, momentum) (12).

    The root's whole ``state_dict()`` is sent as one pickled object, so it does not
    matter which ranks have state yet: a rank without any receives the root's, and
    if the root has none, every rank ends with none. (Horovod instead broadcasts
    tensor by tensor, so it first creates missing state on a rank by calling the
    optimizer's ``step()`` with zero gradients.)"""
    _require_init("broadcast_optimizer_state")
    _check_root(root_rank)
    if isinstance(optimizer, DistributedOptimizer):
        optimizer = optimizer.optimizer
    message: list[Any] = [None]
    if dist.get_rank() == root_rank:
        state = optimizer.state_dict()
        message[0] = {  # tensors travel on the CPU; load_state_dict moves them back
            "state": {
                index: {
                    key: value.cpu() if torch.is_tensor(value) else value
                    for key, value in values.items()
                }
                for index, values in state["state"].items()
            },
            "param_groups": state["param_groups"],
        }
    dist.broadcast_object_list(message, src=root_rank)
    if dist.get_rank() != root_rank:
        optimizer.load_state_dict(message[0])


@dataclass
class Fusion:
    """Gradients that travel together in one all-reduce, Horovod's tensor fusion
    (12)."""

    names: list[str]
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (total elements,): the gradients, flat, then their sum
    work: Any  # the running all-reduce (a torch.distributed Work)
    # Parameters whose gradient had not reached a fusion buffer when this all-reduce
    # started: more than 0 means it started while backward was still computing.
    gradients_to_come: int


class DistributedOptimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged (``op=Average``)
    or summed (``Sum``) over the ranks, like ``hvd.DistributedOptimizer`` (12).

    A hook on each parameter (``register_post_accumulate_grad_hook``) hands its
    gradient to the open fusion buffer as soon as backward has computed it. When
    the next gradient would not fit in ``fusion_threshold_mb`` (MiB, as Horovod's
    ``--fusion-threshold-mb``; 0: every gradient alone), the buffer is sent with one
    ``dist.all_reduce(async_op=True)`` while backward goes on. :meth:`synchronize`
    sends the rest, waits, divides by the size (``Average``) and copies the results
    into ``.grad``; :meth:`step` calls it, then the wrapped optimizer's ``step()``.
    With ``backward_passes_per_step=k`` the gradients of k backward passes
    accumulate in ``.grad`` and are sent during the k-th (scale each loss by 1/k
    for the mean). ``named_parameters`` names the gradients (in :attr:`fusions`);
    without it they are called ``allreduce.noname.<group>.<index>``, as in Horovod.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, nn.Parameter]] | None = None,
        backward_passes_per_step: int = 1,
        op: str = Average,
        fusion_threshold_mb: float = FUSION_THRESHOLD_MB,
    ) -> None:
        _require_init("DistributedOptimizer")
        check_positive_int("backward_passes_per_step", backward_passes_per_step)
        check_choice("op", op, OPS)
        check_number(
            "fusion_threshold_mb",
            fusion_threshold_mb,
            "Pass e.g. fusion_threshold_mb=128, or 0 to send every gradient alone.",
            allow_zero=True,
        )
        self.optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.threshold_bytes = fusion_threshold_mb * MB
        groups = optimizer.param_groups
        self._params = [p for g in groups for p in g["params"] if p.requires_grad]
        if named_parameters is None:
            self._names = {
                id(p): f"allreduce.noname.{i}.{j}"
                for i, g in enumerate(groups)
                for j, p in enumerate(g["params"])
            }
        else:
            self._names = {id(p): name for name, p in named_parameters}
            unnamed = [p for p in self._params if id(p) not in self._names]
            if unnamed:
                raise ValueError(
                    f"named_parameters was given, but {len(unnamed)} parameter(s) of "
                    "the optimizer are not in it. Pass model.named_parameters() of "
                    "the model whose parameters the optimizer updates."
                )
        self._passes = {id(p): 0 for p in self._params}  # backward passes this step
        self._sent: set[int] = set()  # params whose gradient is in a fusion buffer
        self._pending: list[nn.Parameter] = []  # the open fusion buffer's params
        self._pending_bytes = 0
        self._synchronized = False  # synchronize() ran since the last step
        self.fusions: list[Fusion] = []  # this step's all-reduces, started so far
        self.last_fusions: list[Fusion] = []  # those of the last synchronize()
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_gradient)

    # -- during backward ---------------------------------------------------------
    def _on_gradient(self, param: nn.Parameter) -> None:
        k = self.backward_passes_per_step
        self._passes[id(param)] += 1
        self._synchronized = False
        if self._passes[id(param)] > k:
            raise BackwardPassesError(
                f"backward ran {k + 1} times without optimizer.step(), but this "
                f"DistributedOptimizer has backward_passes_per_step={k}: it sent the "
                f"gradients during backward number {k}. Call optimizer.step() after "
                f"every {k} backward pass(es), or build it with "
                "backward_passes_per_step equal to the micro-batches of a step."
            )
        if self._passes[id(param)] == k:
            self._add_to_fusion(param)

    def _add_to_fusion(self, param: nn.Parameter) -> None:
        if param.grad is None:  # no gradient on this rank: others may have one
            param.grad = torch.zeros_like(param)
        grad = param.grad
        nbytes = grad.numel() * grad.element_size()
        if self._pending:
            first = self._pending[0].grad
            too_big = self._pending_bytes + nbytes > self.threshold_bytes
            if too_big or (grad.dtype, grad.device) != (first.dtype, first.device):
                self._send_fusion()
        self._pending.append(param)
        self._pending_bytes += nbytes
        self._sent.add(id(param))
        if self._pending_bytes >= self.threshold_bytes:
            self._send_fusion()

    def _send_fusion(self) -> None:
        """Start the all-reduce (a sum) of the open buffer's gradients, no wait."""
        params = self._pending
        buffer = torch.cat([p.grad.reshape(-1) for p in params])
        work = dist.all_reduce(buffer, async_op=True)
        names = [self._names[id(p)] for p in params]
        to_come = len(self._params) - len(self._sent)
        self.fusions.append(Fusion(names, params, buffer, work, to_come))
        self._pending, self._pending_bytes = [], 0

    # -- after backward ----------------------------------------------------------
    def synchronize(self) -> None:
        """Send the gradients not sent yet (also after fewer than
        ``backward_passes_per_step`` passes), wait for every all-reduce and leave
        the result in each ``.grad`` (12)."""
        for p in self._params:
            if id(p) not in self._sent:
                self._add_to_fusion(p)
        if self._pending:
            self._send_fusion()
        for fusion in self.fusions:
            fusion.work.wait()
            if self.op == Average:
                fusion.buffer.div_(dist.get_world_size())
            offset = 0
            for p in fusion.params:
                p.grad.copy_(fusion.buffer[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.last_fusions, self.fusions = self.fusions, []
        self._sent.clear()
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True

    def step(self) -> Any:
        """:meth:`synchronize` (unless it was called since backward), then the
        wrapped optimizer's ``step()`` (12)."""
        if not self._synchronized:
            passes = max(self._passes.values(), default=0)
            k = self.backward_passes_per_step
            if passes == 0:
                raise BackwardPassesError(
                    "optimizer.step() was called without a backward pass since the "
                    "last step, so there are no gradients to all-reduce. Call "
                    "loss.backward() before optimizer.step()."
                )
            if passes < k:
                raise BackwardPassesError(
                    f"optimizer.step() came after {passes} backward pass(es), but "
                    f"this DistributedOptimizer has backward_passes_per_step={k}. Run "
                    f"backward {k} times per step, or pass backward_passes_per_step="
                    f"{passes}; to step on fewer on purpose (the end of an epoch), "
                    "call optimizer.synchronize() before optimizer.step()."
                )
            self.synchronize()
        self._synchronized = False
        return self.optimizer.step()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For Horovod's ``synchronize(); clip; with skip_synchronize(): step()``.
        Here :meth:`step` already knows that :meth:`synchronize` ran (12)."""
        yield

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; also starts the count of backward
        passes again. Refused while gradients are being all-reduced (12)."""
        if self._sent:
            raise BackwardPassesError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step(): the gradients' all-reduces are under way, and "
                "step() would write their results back into .grad. Call "
                "optimizer.step() first, then zero_grad()."
            )
        self._passes = dict.fromkeys(self._passes, 0)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # -- the wrapped optimizer's state -------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict[Any, Any]:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)


# ----------------------------------------------------------------------------------
# Workers for the notebook and the tests: top-level, run by launch.spawn. Their first
# argument, the rank that spawn passes, is called rank_ so that the body can ask
# hvd.rank() as a Horovod script does.


def train(
    rank_: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    backward_passes_per_step: int = 1,
    fusion_threshold_mb: float = FUSION_THRESHOLD_MB,
    different_start: bool = True,
) -> History:
    """Notebook 08's training run written as a Horovod script: the same batches
    (:func:`~multigpu.allreduce_sgd.batch_indices`), so the same weights as one
    process on the global batch. With ``different_start`` ranks other than 0 first
    add noise to their weights, as if each had its own seed, so that
    :func:`broadcast_parameters` has work to do. With ``backward_passes_per_step=k``
    each rank's batch is split into k micro-batches (12)."""
    init()
    k = backward_passes_per_step
    per_rank = per_rank_batch_size(config.batch_size, size())
    if per_rank % k != 0:
        raise ValueError(
            f"Each rank's batch of {per_rank} does not split into "
            f"backward_passes_per_step={k} equal micro-batches. Choose a batch_size "
            f"whose share per rank is a multiple of {k}."
        )
    device = rank_device()
    model = copy.deepcopy(model).to(device)  # never change the caller's weights
    if different_start and rank() != 0:
        generator = torch.Generator().manual_seed(rank())
        with torch.no_grad():
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
                p.add_(noise.to(device))
    X, y = X.to(device), y.to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum
    )
    optimizer = DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=k,
        fusion_threshold_mb=fusion_threshold_mb,
    )
    broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast_optimizer_state(optimizer, root_rank=0)
    history = History(rank=rank(), world_size=size())
    batches, steps_per_epoch = run_batches(len(X), config, size(), rank())
    for indices in batches:
        optimizer.zero_grad()
        loss_sum = 0.0
        for chunk in indices.chunk(k):  # k micro-batches of per_rank / k
            loss = nn.functional.cross_entropy(model(X[chunk]), y[chunk]) / k
            loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        history.step_loss.append(loss_sum)
    history.train_loss = epoch_means(history.step_loss, steps_per_epoch)
    history.parameters = cpu_state_dict(model)
    return history


def fusion_worker(
    rank_: int,
    world_size: int,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    fusion_threshold_mb: float,
) -> dict[str, Any]:
    """One training step on X, y with :class:`DistributedOptimizer`: the fused
    all-reduces already started when backward returned (names, gradients still to
    come when each started) and all those of the step (12)."""
    init()
    model = copy.deepcopy(model)
    optimizer = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        fusion_threshold_mb=fusion_threshold_mb,
    )
    nn.functional.cross_entropy(model(X), y).backward()
    during = [(f.names, f.gradients_to_come) for f in optimizer.fusions]
    optimizer.step()
    return {
        "during_backward": during,
        "all": [f.names for f in optimizer.last_fusions],
    }


def broadcast_worker(
    rank_: int, world_size: int, model: nn.Module, form: str, seed: int = 0
) -> dict[str, Any]:
    """Each rank re-initialises a copy of ``model`` from its own seed, then calls
    :func:`broadcast_parameters` with ``form`` ("state_dict", "named_parameters" or
    "parameters"). Rank 0 alone has momentum buffers (one SGD step) and lr=0.1, the
    others lr=0.5 and no state; then :func:`broadcast_optimizer_state`. Returns the
    weights before and after, the momentum buffers and the lr (12)."""
    init()
    model = copy.deepcopy(model)
    torch.manual_seed(seed + rank())
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    before = cpu_state_dict(model)
    params = {
        "state_dict": model.state_dict,
        "named_parameters": model.named_parameters,
        "parameters": model.parameters,
    }[form]()
    broadcast_parameters(params, root_rank=0)
    after = cpu_state_dict(model)
    inner = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if rank() == 0:
        inner.param_groups[0]["lr"] = 0.1
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        inner.step()  # creates the momentum buffers
    optimizer = DistributedOptimizer(inner, named_parameters=model.named_parameters())
    broadcast_optimizer_state(optimizer, root_rank=0)
    return {
        "before": before,
        "after": after,
        "momentum": [inner.state[p].get("momentum_buffer") for p in model.parameters()],
        "lr": inner.param_groups[0]["lr"],
    }


def api_worker(rank_: int, world_size: int) -> dict[str, Any]:
    """What :func:`rank`, :func:`size`, :func:`local_rank`, :func:`local_size`,
    :func:`allreduce` and :func:`allreduce_` give on this rank, with the tensor
    ``[rank + 1, 10 * rank]``; and what :func:`shutdown` leaves (12)."""
    init()
    tensor = torch.tensor([rank() + 1.0, 10.0 * rank()], dtype=torch.float64)
    original = tensor.clone()
    result = {
        "rank": rank(),
        "size": size(),
        "local_rank": local_rank(),
        "local_size": local_size(),
        "average": allreduce(tensor),
        "sum": allreduce(tensor, op=Sum),
        "unchanged": torch.equal(tensor, original),
    }
    returned = allreduce_(tensor, op=Sum)
    result["in_place"] = returned is tensor and torch.equal(tensor, result["sum"])
    result["in_place_average"] = allreduce_(original.clone())
    shutdown()
    result["after_shutdown"] = (is_initialized(), dist.is_initialized())
    init()  # spawn's group is still there
    result["after_init_again"] = is_initialized()
    return result
