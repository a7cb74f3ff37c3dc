"""When a rank dies or hangs, and several nodes: the runs of notebook 11.

Taught in ``notebooks/11_fault_tolerance.ipynb``, with :mod:`multigpu.snapshot`
(what a run saves to survive) and ``python -m multigpu.ddp --snapshot`` (the script
torchrun restarts). Three kinds of trouble, each run for real on this machine:

- **A rank dies.** :func:`run_with_restarts` runs the script under
  ``torchrun --max-restarts``; a rank kills itself (``--kill-rank``) or is killed
  from outside (:func:`kill_rank_from_outside`), torchrun restarts every rank, and
  they resume from the snapshot.
- **A rank hangs.** Its peers wait in a collective until the process group's
  timeout (30 minutes by default on gloo); the error they get names no culprit.
  :func:`late_rank` shows that with a short timeout, and how
  ``dist.monitored_barrier`` names the late rank; :func:`skipped_collective` shows a
  rank that skips a collective, and how ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` names the
  collectives that do not match.
- **Several nodes.** :func:`run_nodes` starts one torchrun per "node" on this
  machine, joined by a c10d rendezvous on a store this process owns (a free port),
  exactly as two hosts would be.

Everything here is bounded in time and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from multigpu.core.checks import check_number, check_positive_int
from multigpu.runtime.launch import (
    TorchrunError,
    run_torchrun,
    start_torchrun,
    stop_torchrun,
)
from multigpu.snapshot import SNAPSHOT_FILE, read_events

HOST = "127.0.0.1"
SETUP_TIMEOUT_S = 60.0  # for making the groups of the hang demonstrations
MODULE = "multigpu.ddp"  # the script torchrun restarts
# What makes a restart on one machine reliable (notebook 11, section 2): the workers
# get a TCP store of their own instead of sharing the agent's rendezvous store.
RELIABLE_RESTARTS = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


# ----------------------------------------------------------------------------------
# A rank dies: torchrun restarts the ranks, they resume from the snapshot


def run_with_restarts(
    folder: str | os.PathLike,
    *script_args: Any,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=N --max-restarts=R -m multigpu.ddp
    --snapshot FOLDER --no-progress script_args...``; its output (11).

    ``env`` is added to :data:`RELIABLE_RESTARTS` (pass ``{"TORCH_DISABLE_SHARE_RDZV_
    TCP_STORE": "0"}`` to see torchrun's default). A run still going after
    ``timeout`` seconds is stopped with every process it started.
    """
    check_positive_int("nproc_per_node", nproc_per_node)
    args, launch = _restartable(folder, script_args, max_restarts, env)
    return run_torchrun(
        MODULE, nproc_per_node, *args, **launch, timeout=timeout, check=False
    )


def _restartable(
    folder: str | os.PathLike,
    script_args: tuple[Any, ...],
    max_restarts: int,
    env: Mapping[str, str] | None,
) -> tuple[list[Any], dict[str, Any]]:
    """The script's arguments and torchrun's options and environment for a run
    that snapshots into ``folder`` and may restart (11)."""
    args = ["--snapshot", folder, "--no-progress", *script_args]
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


def kill_rank_from_outside(
    folder: str | os.PathLike,
    *script_args: Any,
    rank: int = 1,
    after_step: int = 8,
    nproc_per_node: int = 2,
    max_restarts: int = 3,
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
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
    deadline = time.monotonic() + timeout
    with ExitStack() as stack:
        log = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
        args, launch = _restartable(folder, script_args, max_restarts, env)
        process = start_torchrun(MODULE, nproc_per_node, *args, **launch, output=log)
        stack.callback(stop_torchrun, process)
        killed_at = None
        while process.poll() is None and time.monotonic() < deadline:
            if killed_at is None and _steps_done(folder) >= after_step:
                for pid in worker_pids(process.pid, rank):
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.time()
            time.sleep(0.02)
        if process.poll() is None:
            stop_torchrun(process)
            log.seek(0)
            raise TorchrunError(
                f"torchrun did not finish within {timeout} s and was stopped.",
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
    run: the ranks' own lines (``[rank0]:`` tracebacks left out) and torchrun's
    notice of the failed worker, without timestamps, paths or process ids (11)."""
    lines = []
    for line in output.splitlines():
        if line.startswith("epoch "):  # its losses depend on the CPU's kernels
            lines.append(line.split(":")[0] + ": done")
        elif line.startswith(("restart ", "rank ", "snapshot of ", "every ")):
            lines.append(line)
        elif "failed (exitcode:" in line:
            # torchrun names the failure it saw first, by whole seconds: the killed
            # rank or the peer that failed after it, so neither is named here.
            lines.append("torchrun: a worker failed, so the worker group failed")
    return lines


def rank_table_lines(outputs: Sequence[str]) -> list[str]:
    """The table ``--show-ranks`` prints, header first, from whichever node's
    output holds it (the node of rank 0) (11)."""
    for output in outputs:
        lines = output.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("RANK | LOCAL_RANK"):
                table = [line]
                for row in lines[i + 1 :]:
                    if not row[:1].isdigit():
                        break
                    table.append(row)
                return table
    raise ValueError("No rank table in these outputs. Pass --show-ranks to the script.")


def final_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's weights in the last snapshot of ``folder`` (11)."""
    snapshot = torch.load(Path(folder) / SNAPSHOT_FILE, weights_only=True)
    return snapshot["model"]


# ----------------------------------------------------------------------------------
# A rank hangs: the others wait until the timeout; how to find the late rank


def _outcome(rank: int, error: BaseException | None) -> dict[str, Any]:
    """A rank's result, in words that are the same on every run."""
    if error is None:
        return {"rank": rank, "result": "finished"}
    text = str(error)
    names = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    # DETAIL's message starts with this rank's own collective; what it says of the
    # peer's depends on how far the peer had got, so only this rank's is shown.
    own = re.search(rf"Rank {rank} is running collective: .*?OpType=([A-Z_]+)", text)
    if names:
        result = f"monitored_barrier: rank(s) {names.group(1)} did not arrive"
    elif "Detected mismatch between collectives" in text and own:
        result = f"collectives do not match (this rank was in {own.group(1)})"
    elif "Timed out" in text or "timed out" in text.lower():
        result = "timed out, waiting for a peer"
    elif "Connection closed by peer" in text or "Connection reset by peer" in text:
        result = "its peer was gone"
    else:
        result = f"failed: {type(error).__name__}"
    return {"rank": rank, "result": result}


def _short_group(timeout: float) -> Any:
    """A new gloo group of every rank whose collectives give up after ``timeout``
    seconds, so a hang is shown in seconds, not 30 minutes.

    The group is made, and its ranks connected, with a generous timeout (a busy
    machine can take seconds to connect them); ``dist.set_timeout`` then shortens
    it for what follows.
    """
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=SETUP_TIMEOUT_S))
    dist.barrier(group=group)  # every rank is here: the demonstration starts level
    dist.set_timeout(timedelta(seconds=timeout), group)
    return group


def late_rank(
    rank: int,
    world_size: int,
    late: int,
    delay: float,
    timeout: float,
    monitored: bool = False,
) -> dict[str, Any]:
    """Every rank joins one all-reduce; rank ``late`` first sleeps ``delay``
    seconds (a stuck data loader, a slow disk). With ``delay`` above ``timeout``
    the others give up. ``monitored``: first a ``dist.monitored_barrier``, on which
    rank 0 names the ranks that did not arrive. Returns how it went (11)."""
    group = _short_group(timeout)
    error, log = None, []
    with _stderr_into(log):  # gloo's C++ log: returned, not printed
        try:
            if rank == late:
                time.sleep(delay)
            if monitored:
                dist.monitored_barrier(
                    group, timeout=timedelta(seconds=timeout), wait_all_ranks=True
                )
            dist.all_reduce(torch.ones(4), group=group)
        except RuntimeError as caught:
            error = caught
    return {**_outcome(rank, error), "log": log}


def skipped_collective(
    rank: int, world_size: int, skipping: int, timeout: float, detail: bool
) -> dict[str, Any]:
    """Rank ``skipping`` leaves out an all-reduce that the others make (a branch
    such as ``if loss.isfinite(): all_reduce(...)``) and goes on to the next
    collective, a barrier. ``detail``: the group is made at debug level DETAIL,
    what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` gives a torchrun script, so every
    collective is first checked against the other ranks' (11)."""
    previous = dist.get_debug_level()
    if detail:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        group = _short_group(timeout)
    finally:
        dist.set_debug_level(previous)
    error, log = None, []
    with _stderr_into(log):  # gloo's C++ log: returned, not printed
        try:
            if rank != skipping:
                dist.all_reduce(torch.ones(4), group=group)
            dist.barrier(group=group)
        except RuntimeError as caught:
            error = caught
    return {**_outcome(rank, error), "log": log}


@contextlib.contextmanager
def _stderr_into(lines: list[str]) -> Iterator[None]:
    """Send file descriptor 2 (C++ logs included) to a temporary file meanwhile,
    then append its lines to ``lines``, without their time-stamped prefixes."""
    with tempfile.TemporaryFile() as file:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            file.seek(0)
            text = file.read().decode("utf-8", "replace")
            for line in text.splitlines():
                lines.append(
                    re.sub(r"^(\[rank\d+\]:)?\[[A-Z]\d{4} [^\]]*\] ", "", line)
                )


# ----------------------------------------------------------------------------------
# Several nodes on one machine


def node_options(nnodes: int, node_rank: int, port: int, run_id: str) -> list[str]:
    """The rendezvous options of node ``node_rank`` of ``nnodes`` on this machine,
    with the store at 127.0.0.1:``port`` (11). On real hosts the endpoint is the
    first host's address and ``is_host`` is left out."""
    return [
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={HOST}:{port}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=is_host=false",  # the store is this process's, see run_nodes
    ]


def run_nodes(
    *script_args: Any,
    nnodes: int = 2,
    nproc_per_node: int = 2,
    module: str = MODULE,
    timeout: float = 240.0,
) -> list[str]:
    """Start ``nnodes`` torchruns at once, each a "node" of ``nproc_per_node``
    workers, joined into one world of ``nnodes × nproc_per_node`` ranks; return
    each node's output (stdout and stderr together), by node (11).

    The c10d rendezvous needs a store every node can reach. Between hosts the first
    node hosts it on a port fixed in advance; here this process hosts it on a port
    the operating system picks (so runs at the same time never clash), and the
    nodes connect to it as clients (``is_host=false``).
    """
    check_positive_int("nnodes", nnodes)
    check_positive_int("nproc_per_node", nproc_per_node)
    check_number("timeout", timeout, "Pass the seconds to wait, e.g. 240.")
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    run_id = uuid.uuid4().hex[:12]
    deadline = time.monotonic() + timeout
    with ExitStack() as stack:
        logs, processes = [], []
        for node_rank in range(nnodes):
            log = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
            process = start_torchrun(
                module,
                nproc_per_node,
                *script_args,
                rendezvous=node_options(nnodes, node_rank, store.port, run_id),
                env=RELIABLE_RESTARTS,  # workers' own store: see RELIABLE_RESTARTS
                output=log,
            )
            stack.callback(stop_torchrun, process)
            logs.append(log)
            processes.append(process)
        while any(p.poll() is None for p in processes):
            if time.monotonic() > deadline:
                for process in processes:
                    stop_torchrun(process)
                raise TorchrunError(
                    f"{nnodes} nodes did not finish within {timeout} s and were "
                    "stopped.",
                    _read_all(logs),
                )
            time.sleep(0.05)
        outputs = [_read(log) for log in logs]
        failed = [i for i, p in enumerate(processes) if p.returncode != 0]
        if failed:
            raise TorchrunError(
                f"node(s) {failed} exited with an error; their output ends with:\n"
                + "\n".join(outputs[failed[0]].strip().splitlines()[-15:]),
                "\n".join(outputs),
            )
    del store
    return outputs


def _read(log: Any) -> str:
    log.seek(0)
    return log.read()


def _read_all(logs: Sequence[Any]) -> str:
    return "\n".join(_read(log) for log in logs)
