"""A rank dies: torchrun restarts every rank, and they resume from the snapshot
(11)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from multigpu.core.checks import check_positive_int
from multigpu.ddp.cli import OWN_STORE_VARIABLE
from multigpu.runtime.launch import (
    RESTARTS_DEADLINE_S,
    TorchrunError,
    deadline_not_timeout,
    run_torchrun,
    start_torchrun,
    stop_torchrun,
)
from multigpu.snapshot import SNAPSHOT_FILE, read_events

MODULE = "multigpu.snapshot"  # the script torchrun restarts
# What makes a restart on one machine reliable (notebook 11, section 2): the workers
# get a TCP store of their own instead of sharing the agent's rendezvous store. The
# scripts refuse torchrun's restarts without it (multigpu.ddp.cli.check_restarts).
RELIABLE_RESTARTS = {OWN_STORE_VARIABLE: "1"}


@deadline_not_timeout
def run_with_restarts(
    folder: str | os.PathLike,
    *script_args: Any,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    env: Mapping[str, str] | None = None,
    deadline: float = RESTARTS_DEADLINE_S,
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=N --max-restarts=R -m
    multigpu.snapshot --snapshot FOLDER script_args...``; its output (11).

    ``env`` is added to :data:`RELIABLE_RESTARTS` (pass ``{"TORCH_DISABLE_SHARE_RDZV_
    TCP_STORE": "0"}`` to see the script refuse torchrun's default). A run still
    going after ``deadline`` seconds is stopped with every process it started.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    args, launch = _restartable(folder, script_args, max_restarts, env)
    return run_torchrun(
        MODULE, nproc_per_node, *args, **launch, deadline=deadline, check=False
    )


def _restartable(
    folder: str | os.PathLike,
    script_args: tuple[Any, ...],
    max_restarts: int,
    env: Mapping[str, str] | None,
) -> tuple[list[Any], dict[str, Any]]:
    """The script's arguments and torchrun's options and environment for a run
    that snapshots into ``folder`` and may restart (11)."""
    args = ["--snapshot", folder, *script_args]
    launch = {
        "options": [f"--max-restarts={max_restarts}"],
        "env": {**RELIABLE_RESTARTS, **dict(env or {})},
    }
    return args, launch


def worker_pids(torchrun_pid: int, rank: int | None = None) -> list[int]:
    """The process ids of the workers a torchrun started (Linux: read from /proc),
    or of the one whose ``RANK`` is ``rank`` (11)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent != torchrun_pid:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
        if b"TORCHELASTIC_RUN_ID" not in variables:
            continue  # not a worker (e.g. a helper process)
        if rank is None or variables.get(b"RANK") == str(rank).encode():
            found.append(int(entry.name))
    return sorted(found)


@deadline_not_timeout
def kill_rank_from_outside(
    folder: str | os.PathLike,
    *script_args: Any,
    rank: int = 1,
    after_step: int = 8,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    env: Mapping[str, str] | None = None,
    deadline: float = RESTARTS_DEADLINE_S,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run as :func:`run_with_restarts`, and once rank 0 has finished step
    ``after_step``, SIGKILL rank ``rank`` from this process (as the out-of-memory
    killer or a dying machine would). Returns the run's output (stdout and stderr
    together) and the ``time.time()`` of the kill (11). Linux only (/proc)."""
    if not Path("/proc/self/stat").exists():
        raise OSError(
            "kill_rank_from_outside finds the worker's process id in /proc, which "
            "this system lacks. Run it on Linux, or use --kill-rank instead."
        )
    end = time.monotonic() + deadline
    with ExitStack() as stack:
        log = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
        args, launch = _restartable(folder, script_args, max_restarts, env)
        process = start_torchrun(MODULE, nproc_per_node, *args, **launch, output=log)
        stack.callback(stop_torchrun, process)
        killed_at = None
        while process.poll() is None and time.monotonic() < end:
            if killed_at is None and _steps_done(folder) >= after_step:
                for pid in worker_pids(process.pid, rank):
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.time()
            time.sleep(0.02)
        if process.poll() is None:
            stop_torchrun(process)
            log.seek(0)
            raise TorchrunError(
                f"torchrun did not finish within {deadline} s and was stopped.",
                log.read(),
            )
        log.seek(0)
        output = log.read()
    if killed_at is None:
        raise TorchrunError(
            f"The run ended before step {after_step}, so no rank was killed. Pass a "
            "smaller after_step, or slow the run down with --step-delay.",
            output,
        )
    result = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    return result, killed_at


def _steps_done(folder: str | os.PathLike) -> int:
    """The last step rank 0 has finished in the first launch, from its events."""
    steps = [
        event["global_step"]
        for event in read_events(folder)
        if event["event"] == "step" and event["restart"] == 0
    ]
    return max(steps, default=0)


def restart_log(output: str) -> list[str]:
    """The lines of a restarted run's output that tell its story, the same on every
    run: the ranks' own lines and torchrun's notice of the failed worker, without
    timestamps, paths or process ids (11). Left out: ``[rank0]:`` tracebacks and a
    surviving rank's ``rank R: <error>`` line, which depends on whether its
    collective failed before torchrun stopped it."""
    lines = []
    for line in output.splitlines():
        if line.startswith("epoch "):  # its losses depend on the CPU's kernels
            lines.append(line.split(":")[0] + ": done")
        elif line.startswith(("restart ", "snapshot of ", "every ")):
            lines.append(line)
        elif re.match(r"rank \d+: SIGKILL to itself", line):  # the injected fault
            lines.append(line)
        elif "failed (exitcode:" in line:
            # torchrun names the failure it saw first, by whole seconds: the killed
            # rank or the peer that failed after it, so neither is named here.
            lines.append("torchrun: a worker failed, so the worker group failed")
    return lines


def final_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's weights in the last snapshot of ``folder`` (11)."""
    snapshot = torch.load(Path(folder) / SNAPSHOT_FILE, weights_only=True)
    return snapshot["model"]
