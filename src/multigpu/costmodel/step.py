"""The step time of data-parallel training, DDP's and DataParallel's (12).

One training step on one device takes ``compute`` seconds (forward, backward and
optimizer for a batch of b samples). With N devices each doing b samples, the
models add the time spent moving data and whatever of it is not hidden:

- **DDP** (one process per device, ring all-reduce in buckets during backward):
  the G gradient bytes travel in K buckets of G/K, each a ring all-reduce
  (2(N-1)·α + 2(N-1)/N·(G/K)/B). The buckets become ready one after another
  during backward (here: evenly spaced over it) and are sent one at a time, so
  all but the last can hide behind the rest of backward; what is left after
  backward ends is *exposed* and adds to the step (:func:`ddp_step`). Given a
  measured overlap fraction instead (notebook 10's timeline), the hidden part is
  that fraction of the communication, at most the backward time.
- **DataParallel** (one process, one thread per device, everything through device 0):
  each step broadcasts the parameters from device 0 (``replicate``), scatters the
  input from it and gathers the outputs back to it, and after backward reduces the
  gradients onto it (the backward of the broadcast); nothing overlaps with compute.
  PyTorch's ``torch.cuda.comm`` uses NCCL's broadcast and reduce, pipelined so that
  each costs about (N-1)·α + G/B; scatter and gather move (N-1)·b samples' inputs
  and outputs through device 0's link. The N threads share one interpreter lock:
  the Python work of launching each replica's forward is done one thread at a
  time, ``host`` seconds per replica (:func:`dataparallel_step`).

Speed-up is throughput against one device with the same per-device batch:
S(N) = N·t(1)/t(N). The limits are the textbook ones: N = 1 costs nothing extra;
free links (α = 0, B = ∞) or full overlap give S(N) = N.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from multigpu.core.checks import check_positive_int
from multigpu.costmodel.communication import alpha_beta_time
from multigpu.costmodel.hardware import Link, Machine


@dataclass(frozen=True)
class Workload:
    """One device's training step: ``compute`` seconds (forward, backward and
    optimizer) for ``batch`` samples of a model with ``parameters`` parameters
    whose gradients are ``bytes_per_gradient`` each; ``backward_share`` of compute
    is backward, when gradients become ready (about 2/3: backward does twice the
    work of forward); ``sample_bytes`` and ``output_bytes`` per sample are what
    DataParallel scatters and gathers (12)."""

    name: str
    parameters: int
    compute: float
    batch: int
    bytes_per_gradient: int = 4
    backward_share: float = 2 / 3
    sample_bytes: float = 0.0
    output_bytes: float = 0.0

    @property
    def gradient_bytes(self) -> float:
        return float(self.parameters * self.bytes_per_gradient)


@dataclass(frozen=True)
class StepTime:
    """A predicted step, in seconds: ``compute`` on each device, ``host`` (Python
    work done one thread at a time), ``communication`` in all, of which ``hidden``
    ran during backward; ``total`` is what a step takes (12)."""

    method: str
    world_size: int
    batch: int
    compute: float
    communication: float
    hidden: float = 0.0
    host: float = 0.0

    @property
    def exposed(self) -> float:
        return self.communication - self.hidden

    @property
    def total(self) -> float:
        return self.compute + self.host + self.exposed

    @property
    def samples_per_second(self) -> float:
        return self.world_size * self.batch / self.total


def bucket_exposed_time(
    bucket_seconds: float, buckets: int, backward_seconds: float
) -> float:
    """Seconds of communication left after backward when ``buckets`` buckets of
    ``bucket_seconds`` each become ready at evenly spaced moments of backward,
    the last one as it ends, and are sent one at a time (12)."""
    finished = 0.0
    for k in range(1, buckets + 1):
        ready = backward_seconds * k / buckets
        finished = max(finished, ready) + bucket_seconds
    return finished - backward_seconds


def ddp_step(
    workload: Workload,
    world_size: int,
    link: Link,
    buckets: int = 1,
    overlap: float | None = None,
) -> StepTime:
    """DDP's step on ``world_size`` devices: the gradients all-reduced in ``buckets``
    ring all-reduces over ``link``. Without ``overlap`` the hidden part follows
    from the buckets' schedule (:func:`bucket_exposed_time`); with it, that fraction
    of the communication is hidden, at most the backward time (12)."""
    check_positive_int("world_size", world_size, "Pass a number of devices, e.g. 8.")
    check_positive_int("buckets", buckets, "Pass e.g. buckets=1: one all-reduce.")
    if world_size == 1:  # DDP on one device does not communicate
        return StepTime("DDP", 1, workload.batch, workload.compute, 0.0)
    per_bucket = alpha_beta_time(
        "ring",
        workload.gradient_bytes / buckets,
        world_size,
        link.latency,
        link.bandwidth,
    )
    communication = buckets * per_bucket
    backward = workload.backward_share * workload.compute
    if overlap is None:
        hidden = communication - bucket_exposed_time(per_bucket, buckets, backward)
    else:
        if not 0 <= overlap <= 1:
            raise ValueError(f"overlap is a fraction in [0, 1], got {overlap!r}.")
        hidden = min(overlap * communication, backward)
    return StepTime(
        "DDP", world_size, workload.batch, workload.compute, communication, hidden
    )


def dataparallel_step(
    workload: Workload, world_size: int, link: Link, host: float = 0.0
) -> StepTime:
    """DataParallel's step on ``world_size`` devices behind device 0's ``link``:
    broadcast of the parameters and reduce of the gradients (pipelined, each
    (N-1)·α + G/B), scatter of the inputs and gather of the outputs through device
    0, none of it overlapped; ``host`` seconds of Python work per replica done one
    thread at a time (12)."""
    check_positive_int("world_size", world_size, "Pass a number of devices, e.g. 8.")
    if world_size == 1:  # DataParallel on one device calls the module directly
        return StepTime("DataParallel", 1, workload.batch, workload.compute, 0.0)
    others = world_size - 1
    broadcast = others * link.latency + workload.gradient_bytes / link.bandwidth
    moved = others * workload.batch * (workload.sample_bytes + workload.output_bytes)
    scatter_gather = 2 * others * link.latency + moved / link.bandwidth
    return StepTime(
        "DataParallel",
        world_size,
        workload.batch,
        workload.compute,
        2 * broadcast + scatter_gather,
        host=world_size * host,
    )


def speedup(step: StepTime, single: StepTime) -> float:
    """Throughput of ``step`` over that of one device, ``single`` (12)."""
    return step.samples_per_second / single.samples_per_second


def scaling_curve(
    workload: Workload,
    machine: Machine,
    world_sizes: Iterable[int],
    method: str = "DDP",
    buckets: int | None = None,
    host: float = 0.0,
) -> list[StepTime]:
    """Predicted steps of ``method`` ("DDP" or "DataParallel") for each world size
    on ``machine``; DDP's buckets default to PyTorch's 25 MB each (12)."""
    if buckets is None:
        buckets = max(1, math.ceil(workload.gradient_bytes / 25e6))
    steps = []
    for n in world_sizes:
        link = machine.link(n)
        if method == "DDP":
            steps.append(ddp_step(workload, n, link, buckets))
        elif method == "DataParallel":
            if n > machine.devices_per_node:
                raise ValueError(
                    f"DataParallel runs in one process on one node: {n} devices is "
                    f"more than {machine.name}'s {machine.devices_per_node}."
                )
            steps.append(dataparallel_step(workload, n, link, host))
        else:
            raise ValueError(f"Unknown method {method!r}. Use 'DDP' or 'DataParallel'.")
    return steps


def calibrate_compute(
    workload: Workload, world_size: int, link: Link, buckets: int, seconds: float
) -> Workload:
    """``workload`` with the compute time for which DDP's predicted step on
    ``world_size`` devices takes ``seconds``: for published results that give no
    single-device time, one DDP row fixes compute and the model predicts the rest
    (12)."""
    low, high = 0.0, seconds
    for _ in range(60):  # bisection: the step grows with compute
        middle = (low + high) / 2
        trial = replace(workload, compute=middle)
        if ddp_step(trial, world_size, link, buckets).total < seconds:
            low = middle
        else:
            high = middle
    return replace(workload, compute=(low + high) / 2)
