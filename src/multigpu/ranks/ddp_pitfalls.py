"""What notebook 09's pitfalls and its evaluation exercise run: a model that notes
which samples it saw, the rank that runs a learner's evaluation with it, the
deprecated ``torch.distributed.launch`` run as a subprocess, a rank started by
``torch.multiprocessing.spawn`` that joins its group through ``init_method``, and
ranks that meet in DDP's constructor (09)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from multigpu.runtime.launch import TORCHRUN_DEADLINE_S, deadline_not_timeout


class SampleLookupNet(nn.Module):
    """A classifier that looks its logits up by sample: ``X[:, 0]`` holds each
    sample's index into ``logits`` (N, classes). It notes every index it is called
    on in ``seen``, so a checker can tell which samples each rank evaluated (09)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("logits", logits.clone())
        self.seen: list[int] = []

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        indices = X[:, 0].round().long()
        self.seen.extend(indices.tolist())
        return self.logits[indices]


def counted_evaluation_rank(
    rank: int,
    world_size: int,
    evaluation: Callable[..., Any],
    model: SampleLookupNet,
    X: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """Run the learner's ``evaluation(model, X, y)`` on this rank; return what it
    returned and the sorted indices of the samples it showed the model (09)."""
    result = evaluation(model, X, y)
    return {"result": result, "seen": sorted(set(model.seen))}


@deadline_not_timeout
def run_deprecated_launch(
    module: str, nproc_per_node: int = 1, deadline: float = TORCHRUN_DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.launch --nproc-per-node=N -m module``, as the
    older walk-throughs start a script; its stdout and stderr as text (09).

    The launcher and everything in its process group are killed at ``deadline``
    (seconds, the whole run), as :func:`~multigpu.runtime.launch.run_torchrun` does.
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.launch",
        f"--nproc-per-node={nproc_per_node}",
        "-m",
        module,
    ]
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def free_ports(count: int) -> list[int]:
    """``count`` ports found free on 127.0.0.1 just now. Another program may take one
    before it is used: ``launch.spawn`` avoids that race by letting its store bind
    port 0 itself (09). On Linux they are drawn below the range from which the system
    gives ports to outgoing connections (``ip_local_port_range``), so that the
    connections other programs open cannot take them; elsewhere, port 0 picks."""
    low = ephemeral_start()
    draws = random.Random().sample(range(FIRST_FREE_PORT, low), count) if low else []
    ports: list[int] = []
    for port in draws:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # taken: let the system pick this one
                continue
        ports.append(port)
    sockets = [socket.socket() for _ in range(count - len(ports))]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return ports + [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


FIRST_FREE_PORT = 20000  # above the ports services usually listen on


def ephemeral_start() -> int | None:
    """The first port of Linux's ephemeral range, from which the system gives ports
    to outgoing connections; None where it cannot be read or leaves no room below
    it (09)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low > FIRST_FREE_PORT + 1000 else None


def init_methods_rank(
    rank: int, world_size: int, env_port: int, tcp_port: int, folder: str
) -> None:
    """What ``torch.multiprocessing.spawn`` runs in each new process: join a gloo
    group through ``init_method="env://"`` (``MASTER_ADDR`` and ``MASTER_PORT`` set
    here, as torchrun would set them), all-reduce ``rank + 1``, leave; then the same
    through ``"tcp://127.0.0.1:PORT"``. mp.spawn throws a worker's return value
    away, so the sums go to ``folder/rank{rank}.json`` (09)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(env_port))
    sums = {}
    methods = {"env://": "env://", "tcp://": f"tcp://127.0.0.1:{tcp_port}"}
    for name, init_method in methods.items():
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=60),
        )
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)  # every rank: 1 + 2 + ... + world_size
        sums[name] = value.item()
        dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(sums))


def read_rank_files(folder: str, world_size: int) -> list[dict[str, float]]:
    """What :func:`init_methods_rank` wrote, by rank (09)."""
    return [
        json.loads(Path(folder, f"rank{rank}.json").read_text())
        for rank in range(world_size)
    ]


def ddp_construction_waits_rank(
    rank: int, world_size: int, late_rank: int, delay_s: float
) -> float:
    """Rank ``late_rank`` sleeps ``delay_s`` before wrapping its model in
    DistributedDataParallel; every rank returns the seconds it spent in DDP's
    constructor, whose collectives (a check of the parameters' shapes, then the
    broadcast of rank 0's parameters and buffers) wait for every rank (09)."""
    model = nn.Linear(4, 2)
    if rank == late_rank:
        time.sleep(delay_s)
    start = time.perf_counter()
    DistributedDataParallel(model)
    return time.perf_counter() - start
