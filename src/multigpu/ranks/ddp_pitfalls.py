"""What notebook 09's pitfalls and its evaluation exercise run: a model that notes
which samples it saw, the rank that runs a learner's evaluation with it, and the
deprecated ``torch.distributed.launch`` run as a subprocess (09)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


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


def run_deprecated_launch(
    module: str, nproc_per_node: int = 1, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.launch --nproc-per-node=N -m module``, as the
    older walk-throughs start a script; its stdout and stderr as text (09).

    The launcher and everything in its process group are killed at ``timeout``.
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
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
