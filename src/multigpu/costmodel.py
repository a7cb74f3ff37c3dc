"""What an all-reduce costs: bytes per rank, the α-β time model, bus bandwidth (07).

Taught in ``notebooks/07_collectives_from_scratch.ipynb``, next to the bytes and
times measured with :mod:`multigpu.collectives`; notebook 12 extends this module
into the cost model of data-parallel training, and notebook 13 adds the memory and
traffic of the ZeRO stages, so new formulas belong here.

For a tensor of S bytes all-reduced on n ranks:

- Bytes sent per rank. Naive (through rank 0): (n-1)·S on rank 0, S on every other
  rank. Ring: 2(n-1)/n·S on every rank, exact when n divides the element count; the
  ring sends every chunk twice, except the one it keeps in the reduce-scatter and
  the one it does not pass on in the all-gather, so uneven chunks give each rank a
  slightly different count (:func:`ring_bytes_per_rank`).
- Time, α-β model: a message of m bytes costs α + m/B (α the latency of one message,
  B the bandwidth of one link), counted on the busiest link.
  Ring: 2(n-1) steps of S/n bytes, t ≈ 2(n-1)·α + 2(n-1)/n·S/B.
  Naive: rank 0 handles 2(n-1) whole tensors one after another,
  t ≈ 2(n-1)·(α + S/B).
  Tree: a binomial-tree reduce to rank 0, then a binomial-tree broadcast from it,
  each ⌈log2 n⌉ rounds in which a rank sends or receives at most one whole tensor:
  t ≈ 2⌈log2 n⌉·(α + S/B). From 4 ranks on that is fewer steps than the ring
  (latency 2·log2(n)·α instead of 2(n-1)·α), but every step carries S instead of
  S/n: the tree wins on small tensors, the ring on large ones. (NCCL's trees
  also cut the tensor into pieces that stream through the tree one after another,
  so that a large tensor no longer pays ⌈log2 n⌉ times S/B; this unpipelined tree
  is the simplest one.)
- Bandwidth, as nccl-tests report it
  (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
  algbw = S/t; for all-reduce busbw = algbw·2(n-1)/n, the number to compare with a
  link's bandwidth and across world sizes.

Reduce-scatter, all-gather and the ZeRO stages (13)
---------------------------------------------------

The ring's two halves (``collectives.reduce_scatter`` and ``collectives.all_gather``)
each send every chunk once except one: (n-1)/n·S, half of a ring all-reduce
(:func:`reduce_scatter_bytes_per_rank`, :func:`all_gather_bytes_per_rank`).

ZeRO ("Zero Redundancy Optimizer", Rajbhandari et al., 2020) cuts Adam's training
state into N shards, one stage at a time. Each rank keeps, per parameter, in
float32 (value 4, gradient 4, Adam's two moments 8 bytes):

============  =================================  ========================
stage         what is cut into N shards          bytes per parameter (fp32)
============  =================================  ========================
``"DDP"``     nothing                            4 + 4 + 8 = 16
``"ZeRO-1"``  the optimizer state                4 + 4 + 8/N
``"ZeRO-2"``  optimizer state and gradients      4 + (4 + 8)/N
``"ZeRO-3"``  everything, parameters included    (4 + 4 + 8)/N
============  =================================  ========================

The paper's mixed-precision version keeps 2 + 2 + 12 (fp16 parameters and gradients;
an fp32 copy of the parameters and the two fp32 moments):
:func:`zero_bytes_per_parameter`, and times the parameter count
:func:`zero_memory_ledger`. What each stage sends per step, in passes of
(n-1)/n·S: :func:`zero_bytes_sent_theory`; counted chunk by chunk as
:mod:`multigpu.zero` sends it: :func:`zero_bytes_sent_per_rank`.

The step time of data-parallel training (12)
--------------------------------------------

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

Links are plain data (:data:`LINKS`): bandwidth per direction, as a ring uses it,
and a per-message latency. Bandwidths are the published peaks; real collectives
reach less (nccl-tests' busbw is typically 70-90 % of them), and the latencies are
orders of magnitude, not specifications. Sources:

- PCIe: 8 / 16 / 32 GT/s per lane for 3.0 / 4.0 / 5.0 with 128b/130b encoding, so
  about 15.8 / 31.5 / 63 GB/s per direction for x16 (PCI-SIG quotes 128 GB/s for
  5.0 x16, both directions together).
- NVLink: each V100 has 6 NVLink 2 links of 25 GB/s per direction (150 GB/s per
  direction, 300 GB/s in all, as the DGX-1 topology printed by ``nvidia-smi topo
  -m`` shows); A100: 12 NVLink 3 links, 600 GB/s in all; H100: 18 NVLink 4 links,
  900 GB/s in all (NVIDIA's NVLink pages, https://www.nvidia.com/en-us/data-center/nvlink/).
  TITAN RTX: 2 links, 100 GB/s in all as listed for the same TU102 chip's Quadro
  RTX 6000/8000 (taken here as 50 GB/s per direction).
- InfiniBand EDR: 4 lanes of 25.78 Gb/s, 100 Gb/s, 12.5 GB/s per direction (NCCL's
  maintainers quote 12.2 GB/s reached, and 48 GB/s on a DGX-1 with 4 adapters:
  https://github.com/NVIDIA/nccl-tests/issues/29); HDR 200 Gb/s; Ethernet likewise.
- Latency per message: NVIDIA publishes none for collectives. Users' nccl-tests
  runs in NVIDIA/nccl's GitHub issues show 8-32 byte all-reduces of about 10 µs on
  2 NVLinked A100s and 20 µs across two InfiniBand nodes, so α of 5 µs (NVLink,
  PCIe) and 10 µs (InfiniBand) per message; TCP Ethernet 25 µs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from multigpu.collectives import ring_chunk_sizes
from multigpu.core.checks import check_choice, check_positive_int
from multigpu.core.reproducibility import round_sig

# The ZeRO stages by what each rank keeps whole (13), the paper's two ways of
# counting bytes, and the rows of a memory ledger.
ZERO_STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
ZERO_PRECISIONS = ("fp32", "mixed")
LEDGER_CATEGORIES = ("parameters", "gradients", "optimizer", "gathered")


def naive_bytes_per_rank(nbytes: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends in ``collectives.naive_all_reduce`` of an ``nbytes``
    tensor: (n-1)·S on rank 0, S elsewhere (07)."""
    if world_size == 1 or nbytes == 0:
        return 0
    return (world_size - 1) * nbytes if rank == 0 else nbytes


def ring_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.ring_all_reduce``: every chunk
    twice, except chunk r+1 (kept in the reduce-scatter) and r+2 (not sent on) (07)."""
    if world_size == 1:
        return 0
    sizes = ring_chunk_sizes(numel, world_size)
    skipped = sizes[(rank + 1) % world_size] + sizes[(rank + 2) % world_size]
    return (2 * numel - skipped) * element_size


def ring_bytes_theory(nbytes: float, world_size: int) -> float:
    """2(n-1)/n · S: what each rank sends in a ring all-reduce (exact when n
    divides the element count) (07)."""
    return 2 * (world_size - 1) / world_size * nbytes


def reduce_scatter_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.reduce_scatter`` of ``numel``
    elements: every chunk once except its own, (n-1)/n·S when n divides ``numel``
    (13)."""
    sizes = ring_chunk_sizes(numel, world_size)
    return (numel - sizes[rank]) * element_size


def all_gather_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in ``collectives.all_gather`` into ``numel``
    elements: every chunk once except the one of its right neighbour, the last to
    arrive (13)."""
    sizes = ring_chunk_sizes(numel, world_size)
    return (numel - sizes[(rank + 1) % world_size]) * element_size


def tree_steps(world_size: int) -> int:
    """Messages on the critical path of a binomial-tree reduce then broadcast:
    2⌈log2 n⌉ (07)."""
    return 2 * (world_size - 1).bit_length()  # (n-1).bit_length() = ⌈log2 n⌉


def alpha_beta_time(
    algorithm: str, nbytes: float, world_size: int, alpha: float, bandwidth: float
) -> float:
    """Seconds the α-β model predicts for a "ring", "naive" or "tree" all-reduce of
    ``nbytes`` with ``alpha`` seconds per message and ``bandwidth`` bytes/s per link;
    the formulas and the tree are in the module's docstring (07, 12)."""
    steps = 2 * (world_size - 1)
    if algorithm == "ring":
        return steps * alpha + ring_bytes_theory(nbytes, world_size) / bandwidth
    if algorithm == "naive":
        return steps * (alpha + nbytes / bandwidth)
    if algorithm == "tree":
        return tree_steps(world_size) * (alpha + nbytes / bandwidth)
    raise ValueError(f"Unknown algorithm {algorithm!r}. Use 'ring', 'naive' or 'tree'.")


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """nccl-tests' algbw: tensor bytes over time, bytes/s (07)."""
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' busbw for all-reduce: algbw · 2(n-1)/n, comparable across world
    sizes and with link bandwidth, bytes/s (07)."""
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


# ----------------------------------------------------------------------------------
# Fitting α and B to measured all-reduce times (12)


def fit_alpha_beta(rows: Iterable[Mapping[str, float]]) -> tuple[float, float]:
    """α (seconds per message) and B (bytes/s) of the ring model
    t = 2(n-1)·α + 2(n-1)/n·S/B, fitted by least squares in relative error to
    measured rows with "bytes", "world_size" and "seconds" (as
    ``workers.time_all_reduces`` returns them) (12).

    Raises ValueError when the rows cannot determine both (fewer than two distinct
    points, or a fit that needs a negative latency or bandwidth cost, which means
    the times do not grow with the bytes)."""
    points = [
        (
            2.0 * (row["world_size"] - 1),
            ring_bytes_theory(row["bytes"], int(row["world_size"])),
            row["seconds"],
        )
        for row in rows
        if row["world_size"] > 1
    ]
    if any(t <= 0 for _, _, t in points):
        raise ValueError("fit_alpha_beta needs measured times above zero seconds.")
    if len({(steps, sent) for steps, sent, _ in points}) < 2:
        raise ValueError(
            "fit_alpha_beta needs all-reduce times for at least two different sizes "
            f"(or world sizes) with 2 or more ranks; got {len(points)} usable rows. "
            "Measure a few sizes, for example 4 KiB to 4 MiB."
        )
    # Normal equations of the two-parameter fit t = steps·α + sent·(1/B), each row
    # weighted by 1/t², so that the error counted is relative: times that span
    # three orders of magnitude all count, not only the largest.
    weights = [1.0 / t**2 for _, _, t in points]
    saa = sum(w * a * a for w, (a, _, _) in zip(weights, points))
    sab = sum(w * a * b for w, (a, b, _) in zip(weights, points))
    sbb = sum(w * b * b for w, (_, b, _) in zip(weights, points))
    sat = sum(w * a * t for w, (a, _, t) in zip(weights, points))
    sbt = sum(w * b * t for w, (_, b, t) in zip(weights, points))
    det = saa * sbb - sab * sab
    if det == 0:
        raise ValueError(
            "fit_alpha_beta cannot tell latency from bandwidth: every row sends "
            "the same bytes per message. Measure several tensor sizes."
        )
    alpha = (sat * sbb - sbt * sab) / det
    inverse_bandwidth = (saa * sbt - sab * sat) / det
    if alpha < 0 or inverse_bandwidth <= 0:
        raise ValueError(
            f"The fit gives α = {alpha:.3g} s and 1/B = {inverse_bandwidth:.3g} s/B: "
            "the times do not grow with the bytes as the α-β model assumes. "
            "Measure larger tensors (up to a few MiB) or repeat the measurement on "
            "a quieter machine."
        )
    return alpha, 1.0 / inverse_bandwidth


# ----------------------------------------------------------------------------------
# ZeRO: what each rank keeps and sends (13)


def zero_bytes_per_parameter(
    stage: str, world_size: int, precision: str = "fp32"
) -> dict[str, float]:
    """The ZeRO paper's bytes per parameter that each of ``world_size`` ranks
    keeps under ``stage``, by category: fp32 Adam 4 + 4 + 8, mixed precision
    2 + 2 + 12 (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    check_positive_int("world_size", world_size)
    check_choice("precision", precision, ZERO_PRECISIONS)
    parameters, gradients, optimizer = (4, 4, 8) if precision == "fp32" else (2, 2, 12)
    level = ZERO_STAGES.index(stage)  # 0 for DDP, 3 for ZeRO-3
    return {
        "parameters": parameters / (world_size if level >= 3 else 1),
        "gradients": gradients / (world_size if level >= 2 else 1),
        "optimizer": optimizer / (world_size if level >= 1 else 1),
        "gathered": 0.0,
    }


def zero_memory_ledger(
    stage: str,
    world_size: int,
    num_parameters: float,
    precision: str = "fp32",
    element_size: int = 4,
) -> dict[str, float]:
    """Bytes each rank keeps by category: :func:`zero_bytes_per_parameter` times
    ``num_parameters``; for fp32, ``element_size=8`` counts float64 instead
    (8 + 8 + 16) (13)."""
    per_parameter = zero_bytes_per_parameter(stage, world_size, precision)
    scale = element_size / 4 if precision == "fp32" else 1
    return {
        name: value * num_parameters * scale for name, value in per_parameter.items()
    }


def zero_bytes_sent_theory(stage: str, nbytes: float, world_size: int) -> float:
    """Bytes each rank sends per step for a model of ``nbytes`` of parameters:
    2(n-1)/n·S for DDP and ZeRO-2, 3(n-1)/n·S for ZeRO-1 (as :mod:`multigpu.zero`
    writes it: an all-reduce, then an all-gather) and ZeRO-3 (two all-gathers and a
    reduce-scatter) (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    check_positive_int("world_size", world_size)
    passes = 3 if stage in ("ZeRO-1", "ZeRO-3") else 2  # passes of (n-1)/n·S
    return passes * (world_size - 1) / world_size * nbytes


def zero_bytes_sent_per_rank(
    stage: str,
    layer_numels: Sequence[int],
    element_size: int,
    world_size: int,
    rank: int,
) -> int:
    """Exact bytes ``rank`` sends in one step of ``stage`` as :mod:`multigpu.zero`
    runs it, counted chunk by chunk; ``layer_numels`` are the parameters per layer
    (ZeRO-3 gathers layer by layer, the others move one flat buffer) (13)."""
    check_choice("stage", stage, ZERO_STAGES)
    args = (element_size, world_size, rank)
    total = sum(layer_numels)
    if stage == "DDP":
        return ring_bytes_per_rank(total, *args)
    if stage == "ZeRO-1":
        return ring_bytes_per_rank(total, *args) + all_gather_bytes_per_rank(
            total, *args
        )
    if stage == "ZeRO-2":
        return reduce_scatter_bytes_per_rank(total, *args) + all_gather_bytes_per_rank(
            total, *args
        )
    return sum(
        2 * all_gather_bytes_per_rank(numel, *args)
        + reduce_scatter_bytes_per_rank(numel, *args)
        for numel in layer_numels
    )


# ----------------------------------------------------------------------------------
# Links, machines and workloads as plain data (12)


@dataclass(frozen=True)
class Link:
    """A connection between devices: peak ``bandwidth`` per direction (bytes/s)
    and ``latency`` per message (s); sources in the module docstring (12)."""

    name: str
    bandwidth: float
    latency: float


GB = 1e9
LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("PCIe 3.0 x16", 15.75 * GB, 5e-6),
        Link("PCIe 4.0 x16", 31.5 * GB, 5e-6),
        Link("PCIe 5.0 x16", 63.0 * GB, 5e-6),
        Link("NVLink bridge (TITAN RTX)", 50.0 * GB, 5e-6),
        Link("NVLink 2 (V100)", 150.0 * GB, 5e-6),
        Link("NVLink 3 (A100)", 300.0 * GB, 5e-6),
        Link("NVLink 4 (H100)", 450.0 * GB, 5e-6),
        Link("InfiniBand EDR 100 Gb/s", 12.5 * GB, 10e-6),
        Link("4 x InfiniBand EDR (DGX-1)", 50.0 * GB, 10e-6),
        Link("InfiniBand HDR 200 Gb/s", 25.0 * GB, 10e-6),
        Link("Ethernet 10 Gb/s", 1.25 * GB, 25e-6),
        Link("Ethernet 100 Gb/s", 12.5 * GB, 25e-6),
    )
}


@dataclass(frozen=True)
class Machine:
    """Nodes of ``devices_per_node`` devices joined inside a node by ``intra`` and
    between nodes by ``inter``: a ring over several nodes runs at the pace of its
    slowest link (12)."""

    name: str
    devices_per_node: int
    intra: Link
    inter: Link | None = None

    def link(self, world_size: int) -> Link:
        """The link that bounds a ring over ``world_size`` devices (12)."""
        if world_size <= self.devices_per_node:
            return self.intra
        if self.inter is None:
            raise ValueError(
                f"{self.name} has {self.devices_per_node} devices and no link between "
                f"nodes, so it cannot run {world_size}. Give the Machine an `inter` "
                "link (for example LINKS['InfiniBand EDR 100 Gb/s'])."
            )
        slow = min((self.intra, self.inter), key=lambda link: link.bandwidth)
        latency = max(self.intra.latency, self.inter.latency)
        return Link(f"{slow.name} (between nodes)", slow.bandwidth, latency)


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


# ----------------------------------------------------------------------------------
# Published measurements, and what the model predicts for them (12)


@dataclass(frozen=True)
class Published:
    """A published time and the setting it was measured in: ``seconds`` for
    ``steps`` steps of ``method`` on ``world_size`` devices joined by ``link``;
    ``compute_from`` says where the workload's compute time comes from, ``note``
    what the model leaves out where it misses (12)."""

    source: str
    url: str
    hardware: str
    workload: Workload
    method: str
    world_size: int
    link: Link
    seconds: float
    steps: float = 1.0
    buckets: int = 1
    compute_from: str = ""
    note: str = ""
    calibrates: bool = False  # this row fixed the compute time: it cannot miss


def _published() -> list[Published]:
    resnet50 = Workload("ResNet-50, batch 32, fp32", 25_557_032, 0.097, 32)
    torch_ddp = dict(
        source="PyTorch DDP benchmark",
        url="https://github.com/pytorch/pytorch/blob/main/benchmarks/distributed/ddp/README.md",
        workload=resnet50,
        method="DDP",
        buckets=5,  # 102 MB of gradients in 25 MB buckets
        compute_from="the 1-GPU run without DDP, 0.097 s/iter",
        note="DDP's own cost (hooks, copies into buckets) is not modelled: "
        "1 GPU with DDP already takes 0.100 s",
    )
    gpt2 = Workload("GPT-2 (124 M), batch 4 x 1024 tokens, fp32", 124_439_808, 0.5, 4)
    nvbridge = LINKS["NVLink bridge (TITAN RTX)"]
    gpt2 = calibrate_compute(gpt2, 2, nvbridge, 20, 101.9003 / 200)
    hugging_face = dict(
        source="Hugging Face docs",
        url="https://huggingface.co/docs/transformers/perf_train_gpu_many",
        hardware="2 x TITAN RTX 24 GB",
        workload=gpt2,
        world_size=2,
        steps=200,
        buckets=20,  # 498 MB in 25 MB buckets
        compute_from="calibrated on the DDP run with NVLink",
    )
    resnet18 = Workload("ResNet-18, batch 800 per GPU, ImageNet", 11_689_512, 1.0, 800)
    pcie3 = LINKS["PCIe 3.0 x16"]
    steps_imagenet = 1_281_167 / 3200
    resnet18 = calibrate_compute(resnet18, 4, pcie3, 2, 1188.5 / steps_imagenet)
    tczhangzhi = dict(
        source="tczhangzhi",
        url="https://github.com/tczhangzhi/pytorch-distributed",
        hardware="4 x Tesla V100-PCIe",
        workload=resnet18,
        world_size=4,
        link=pcie3,
        steps=steps_imagenet,
        buckets=2,
        compute_from="calibrated on the DDP run; times per epoch read from a bar "
        "chart; model and batch are the scripts' defaults (the README states neither)",
    )
    resnet34 = Workload("ResNet-34 (5 classes), batch 16", 21_287_237, 9.0 / 184, 16)
    flowers = dict(
        source="WZMIAOMIAO",
        url="https://github.com/WZMIAOMIAO/deep-learning-for-image-processing/"
        "tree/master/pytorch_classification/train_multi_GPU",
        hardware="GPUs not stated (PCIe 3.0 assumed)",
        workload=resnet34,
        method="DDP",
        link=pcie3,
        buckets=4,
        compute_from="the 1-GPU epoch, 9 s for 184 steps of 16 images",
    )
    return [
        Published(
            **torch_ddp,
            hardware="8 x V100 (DGX-1, NVLink)",
            world_size=8,
            link=LINKS["NVLink 2 (V100)"],
            seconds=0.104,
        ),
        Published(
            **torch_ddp,
            hardware="2 x 8 V100, 4 x 100 Gb/s InfiniBand per machine",
            world_size=16,
            link=LINKS["4 x InfiniBand EDR (DGX-1)"],
            seconds=0.104,
        ),
        Published(
            **hugging_face,
            method="DDP",
            link=nvbridge,
            seconds=101.9003,
            calibrates=True,
        ),
        Published(
            **hugging_face,
            method="DataParallel",
            link=nvbridge,
            seconds=110.5948,
            note="DataParallel's interpreter lock is not modelled (host = 0 here)",
        ),
        Published(
            **{**hugging_face, "hardware": "2 x TITAN RTX, NCCL_P2P_DISABLE=1"},
            method="DDP",
            link=pcie3,
            seconds=131.4367,
            note="with peer-to-peer disabled, NCCL copies through host memory, "
            "far below the PCIe peak the model assumes",
        ),
        Published(**tczhangzhi, method="DDP", seconds=1188.5, calibrates=True),
        Published(
            **tczhangzhi,
            method="DataParallel",
            seconds=4138.3,
            note="one process decodes ImageNet's JPEGs for all 4 GPUs (4 loader "
            "workers instead of DDP's 4 per GPU) and runs every replica's Python "
            "under one interpreter lock: the input pipeline, not the links, is "
            "the limit, and the model has no input pipeline",
        ),
        Published(
            **{**tczhangzhi, "workload": replace(resnet18, bytes_per_gradient=2)},
            method="Horovod",
            seconds=1200.3,
            note="Horovod with fp16 gradient compression, modelled as DDP's ring "
            "all-reduce of 2-byte gradients",
        ),
        *(
            Published(
                **flowers,
                world_size=n,
                seconds=seconds,
                steps=math.ceil(2936 / (16 * n)),
                note="fixed costs per epoch (loader start, validation) do not "
                "shrink with more GPUs; at 8 GPUs an epoch is only 23 steps"
                if n == 8
                else "",
            )
            for n, seconds in ((2, 5.5), (4, 3.0), (8, 2.0))
        ),
    ]


PUBLISHED: list[Published] = _published()


def predict(row: Published) -> float:
    """The model's time for a published row, in the row's unit (12)."""
    if row.method in ("DDP", "Horovod"):  # both: ring all-reduces during backward
        step = ddp_step(row.workload, row.world_size, row.link, row.buckets)
    else:
        step = dataparallel_step(row.workload, row.world_size, row.link)
    return row.steps * step.total


def published_table(rows: Iterable[Published] = PUBLISHED) -> list[dict]:
    """One dict per published row: what was run, the published and the predicted
    time, the miss (predicted / published - 1) and what the model leaves out
    (12)."""
    table = []
    for row in rows:
        predicted = predict(row)
        miss = predicted / row.seconds - 1
        table.append(
            {
                "source": row.source,
                "hardware": row.hardware,
                "model": row.workload.name,
                "method": row.method,
                "GPUs": row.world_size,
                "published s": row.seconds,
                "predicted s": round_sig(predicted, 3),
                "miss": "calibrated" if row.calibrates else f"{miss:+.0%}",
                "left out of the model": row.note,
            }
        )
    return table
