"""``hvd.DistributedOptimizer``: gradients all-reduced in fusion buffers while
backward runs (12).

**Where it differs from Horovod.** Horovod sends each gradient's all-reduce to a
background thread; every cycle (``HOROVOD_CYCLE_TIME``, 1 ms by default, 5 ms
before 0.21) the ranks agree, rank 0 coordinating, which tensors are ready on all of
them, and those are fused into one buffer of at most the threshold. Here there is
no thread, no clock and no coordinator, so the ranks agree in advance instead: the
fusion buffers are laid out once, when the optimizer is built (the trainable
parameters in reverse order of registration, as DDP's first buckets, filled up to
the threshold), and every rank sends them in that order, each as soon as all its
gradients have arrived and the buffers before it have gone. A parameter that got no
gradient on this rank (a branch of forward that this rank's batch did not take) is
sent as zeros at :meth:`DistributedOptimizer.synchronize`, as Horovod and DDP's
``find_unused_parameters=True`` do, so every rank sends the same buffers, of the
same sizes, in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.core.checks import check_choice, check_number, check_positive_int
from multigpu.core.sizes import MiB
from multigpu.horovod_api._state import _require_init
from multigpu.horovod_api.errors import BackwardPassesError
from multigpu.horovod_api.ops import OPS, Average

FUSION_THRESHOLD_MB = 128.0  # Horovod's default since 0.21 (64 MB before)


@dataclass
class Fusion:
    """Gradients that travel together in one all-reduce, Horovod's tensor fusion
    (12)."""

    names: list[str]
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (total elements,): the gradients, flat, then their sum
    work: Any  # the running all-reduce (a torch.distributed Work)
    # Parameters whose gradient was not ready yet when this all-reduce started: more
    # than 0 means it started while backward was still computing.
    gradients_to_come: int


def plan_fusion_buffers(
    params: list[nn.Parameter], threshold_bytes: float
) -> list[list[nn.Parameter]]:
    """The fusion buffers, fixed in advance: ``params`` in reverse order (backward
    computes the last layers' gradients first), filled in that order up to
    ``threshold_bytes``. A gradient that would not fit starts the next buffer, as
    does one of another dtype or device; a buffer that reaches the threshold is
    closed, so ``threshold_bytes=0`` gives one buffer per gradient. Every rank
    computes the same list from the same model (12)."""
    buffers: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    current_bytes = 0
    for param in reversed(params):
        nbytes = param.numel() * param.element_size()
        if current:
            first = current[0]
            too_big = current_bytes + nbytes > threshold_bytes
            if too_big or (param.dtype, param.device) != (first.dtype, first.device):
                buffers.append(current)
                current, current_bytes = [], 0
        current.append(param)
        current_bytes += nbytes
        if current_bytes >= threshold_bytes:
            buffers.append(current)
            current, current_bytes = [], 0
    if current:
        buffers.append(current)
    return buffers


class DistributedOptimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged (``op=Average``)
    or summed (``Sum``) over the ranks, like ``hvd.DistributedOptimizer`` (12).

    The fusion buffers are laid out when it is built (:func:`plan_fusion_buffers`:
    at most ``fusion_threshold_mb`` MiB each, as Horovod's ``--fusion-threshold-mb``;
    0: every gradient alone). A hook on each parameter
    (``register_post_accumulate_grad_hook``) marks its gradient ready as soon as
    backward has computed it; the next buffer whose gradients are all ready is sent
    with one ``dist.all_reduce(async_op=True)`` while backward goes on, buffers in
    their fixed order (the last one, unless full, at :meth:`synchronize`).
    :meth:`synchronize` fills the gradients that never came with zeros, sends the
    rest, waits, divides by the size (``Average``) and copies the results into
    ``.grad``; :meth:`step` calls it, then the wrapped optimizer's ``step()``.
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
        self.threshold_bytes = fusion_threshold_mb * MiB
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
        # The fusion buffers, the same on every rank; the next one to send.
        self._layout = plan_fusion_buffers(self._params, self.threshold_bytes)
        self._next_fusion = 0
        last = self._layout[-1] if self._layout else []
        # The last buffer is sent during backward only if it is full; otherwise, as
        # when the next gradient would not fit, at synchronize() (none follows it).
        self._last_is_full = (
            sum(p.numel() * p.element_size() for p in last) >= self.threshold_bytes
        )
        self._ready: set[int] = set()  # params whose gradient is final this step
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
            self._ready.add(id(param))
            self._send_ready_fusions()

    def _send_ready_fusions(self, finished: bool = False) -> None:
        """Send the next buffers of the layout, in order, while all their gradients
        are ready: every rank starts the same all-reduces in the same order. The
        last buffer waits for ``finished`` (synchronize()) unless it is full."""
        last = len(self._layout) - 1
        while self._next_fusion < len(self._layout):
            params = self._layout[self._next_fusion]
            if not all(id(p) in self._ready for p in params):
                return
            if self._next_fusion == last and not (finished or self._last_is_full):
                return
            self._send_fusion(params)
            self._next_fusion += 1

    def _send_fusion(self, params: list[nn.Parameter]) -> None:
        """Start the all-reduce (a sum) of ``params``' gradients, no wait."""
        buffer = torch.cat([p.grad.reshape(-1) for p in params])
        work = dist.all_reduce(buffer, async_op=True)
        names = [self._names[id(p)] for p in params]
        to_come = len(self._params) - len(self._ready)
        self.fusions.append(Fusion(names, params, buffer, work, to_come))

    # -- after backward ----------------------------------------------------------
    def synchronize(self) -> None:
        """Send the gradients not sent yet (also after fewer than
        ``backward_passes_per_step`` passes), wait for every all-reduce and leave
        the result in each ``.grad`` (12)."""
        for p in self._params:
            if id(p) not in self._ready:
                if p.grad is None:  # no gradient on this rank: others may have one
                    p.grad = torch.zeros_like(p)
                self._ready.add(id(p))
        self._send_ready_fusions(finished=True)
        for fusion in self.fusions:
            fusion.work.wait()
            if self.op == Average:
                fusion.buffer.div_(dist.get_world_size())
            offset = 0
            for p in fusion.params:
                p.grad.copy_(fusion.buffer[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.last_fusions, self.fusions = self.fusions, []
        self._ready.clear()
        self._next_fusion = 0
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
        if self._ready:
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
