"""The parent side of spawn: start the ranks, collect their results, end them all."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from multigpu.core.sizes import MiB
from multigpu.runtime.launch import _process_tree
from multigpu.runtime.launch._checks import (
    check_arguments,
    check_collective_timeout,
    check_seconds,
)
from multigpu.runtime.launch._child import HOST, run_rank
from multigpu.runtime.launch._diagnosis import (
    Failure,
    deadline_error,
    failure_error,
    start_deadline_error,
)
from multigpu.runtime.launch._start import end_stopped_forkserver, start_rank
from multigpu.runtime.launch._stderr import StderrTails
from multigpu.runtime.launch._watchdog import Watchdog
from multigpu.runtime.launch.environment import laptop_environment
from multigpu.runtime.launch.rank_functions import (
    check_importable,
    check_main_importable,
)
from multigpu.runtime.launch.timeouts import (
    DEFAULT_DEADLINE_S,
    DEFAULT_TIMEOUT_S,
    as_timedelta,
)

# "forkserver": children forked from a server process that imported torch once;
# "spawn": each child starts a new interpreter and imports torch (seconds per rank).
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# What the forkserver imports once, so that no rank imports it again. torch._dynamo:
# the first torch.optim.Optimizer of a process imports it (add_param_group is wrapped
# by torch._disable_dynamo, which imports it on its first call), about one CPU-second
# per rank otherwise (bench/launch_cost.py). Read when the forkserver starts.
FORKSERVER_PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "multigpu.runtime.launch._child",
]
RANKS_PER_CORE = 4  # more ranks than this per CPU core: spawn warns
MAX_RANKS_PER_CORE = 32  # more than this per CPU core: spawn refuses (MAX_RANKS)
# The memory one rank takes at the least: 12 MiB of its own and 67 MiB of shared
# pages counted in proportion (PSS) for a gloo rank that has joined (2 cores, torch
# 2.14). MAX_RANKS allows one rank per RANK_MEMORY of the machine's memory.
RANK_MEMORY = 64 * MiB
# After the first failure, how long to keep listening for the other ranks' reports,
# so that the error shown is the root cause and not a peer's "connection reset", and
# the same whichever rank reports first (lesson 17's two ranks raise the same error;
# under `make test`'s load rank 0's report once came more than 0.5 s after rank 1's).
# The launch ends as soon as every rank has reported: only a silent rank costs it.
_FAILURE_GRACE_S = 3.0
_PEER_CLOSED_GRACE_S = 5.0  # while every failure is only a closed connection
_POLL_S = 0.2  # how often the parent checks exit codes while waiting


def _context() -> mp.context.BaseContext:
    """The multiprocessing context of START_METHOD; a forkserver preloads
    FORKSERVER_PRELOAD."""
    context = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context


def _resolve_backend(backend: str, world_size: int) -> str:
    import torch.distributed as dist

    from multigpu.core.devices import cuda_device_count

    if backend == "auto":  # nccl only when every rank gets a GPU of its own
        gpus_for_all = 0 < world_size <= cuda_device_count()
        backend = "nccl" if gpus_for_all and dist.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"Unknown backend {backend!r}. Use 'auto', 'gloo' or 'nccl'.")
    if backend == "nccl" and world_size > cuda_device_count():
        raise ValueError(
            f"nccl needs one GPU per rank: world_size={world_size} but this machine "
            f"has {cuda_device_count()} GPU(s). Use fewer ranks or backend='gloo'."
        )
    return backend


def _cpu_count() -> int:
    return os.cpu_count() or 1


def max_ranks(cores: int, memory: int | None) -> int:
    """The most ranks spawn starts on a machine with ``cores`` CPU cores and
    ``memory`` bytes of memory (None: unknown): MAX_RANKS_PER_CORE per core and one
    per RANK_MEMORY. More would crawl far past any timeout, or exhaust the memory
    (10**6 ranks took 15 GB in 18 s before this limit)."""
    limit = MAX_RANKS_PER_CORE * cores
    if memory is not None:
        limit = min(limit, memory // RANK_MEMORY)
    return max(1, limit)


def _memory() -> int | None:
    """The machine's physical memory in bytes, None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# The largest world_size spawn accepts on this machine; raise it if you mean it.
MAX_RANKS = max_ranks(_cpu_count(), _memory())


def _check_machine_can_start(world_size: int) -> None:
    if world_size > MAX_RANKS:
        raise ValueError(
            f"world_size={world_size} is more ranks than spawn starts on this "
            f"machine: at most {MAX_RANKS} (multigpu.runtime.launch.parent.MAX_RANKS: "
            f"{MAX_RANKS_PER_CORE} per CPU core, one per {RANK_MEMORY // MiB} MiB of "
            "memory). Use fewer ranks, or raise MAX_RANKS if you mean it."
        )


def _warn_if_crowded(world_size: int) -> None:
    """Warn when the ranks far outnumber the CPU cores: the launch would crawl."""
    cores = _cpu_count()
    if world_size > RANKS_PER_CORE * cores:
        warnings.warn(
            f"world_size={world_size} starts {world_size} processes on "
            f"{cores} CPU core(s), more than {RANKS_PER_CORE} per core: each rank "
            "gets a small slice of a core, so the launch may crawl and its "
            "collectives may reach their timeout. Use at most "
            f"{RANKS_PER_CORE * cores} ranks on this machine, or raise timeout= "
            "and deadline= if you mean it.",
            RuntimeWarning,
            stacklevel=3,  # the line that called spawn
        )


def spawn(
    worker: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "auto",
    timeout: float | None = DEFAULT_TIMEOUT_S,
    threads: int = 1,
    deadline: float | None = DEFAULT_DEADLINE_S,
) -> list[Any]:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` processes; return
    their results ordered by rank (07-11). ``timeout`` bounds the rendezvous and
    each collective, ``deadline`` the whole launch (seconds; None: no bound). The
    exact contract: docs/launch.md."""
    start = time.monotonic()
    check_importable(worker)
    check_arguments(world_size, threads, timeout=timeout)
    check_collective_timeout(timeout)
    if START_METHOD != "fork":
        check_main_importable()
    _check_machine_can_start(world_size)
    check_seconds("deadline", deadline, "no deadline")
    backend = _resolve_backend(backend, world_size)
    _warn_if_crowded(world_size)
    try:
        payload = pickle.dumps((worker, args))
    except Exception as exc:
        raise TypeError(
            f"The arguments for the workers cannot be pickled ({exc}). Pass tensors, "
            "numbers, strings, lists or dicts."
        ) from exc

    import torch.distributed as dist

    # Port 0: the operating system picks a free port, so launches never clash.
    store = dist.TCPStore(
        HOST,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=as_timedelta(timeout),
    )
    context = _context()
    if START_METHOD == "forkserver":
        end_stopped_forkserver()  # it would never answer: a new one starts instead
    environment = laptop_environment(os.environ, sys.platform)
    # Only this process ever holds the lifeline's write end: when it closes, because
    # spawn is done or because this process died, every rank ends (_watch_lifeline).
    lifeline_reader, lifeline_writer = context.Pipe(duplex=False)
    # The lifeline needs Python to run in the rank; the watchdog kills the ranks
    # even when it cannot (a rank stopped, or in a C call that holds the GIL).
    watchdog = Watchdog()
    processes: list[mp.process.BaseProcess] = []
    readers: list[Connection] = []
    stderr = StderrTails()
    deadline_at = None if deadline is None else start + deadline
    try:
        for rank in range(world_size):
            if deadline_at is not None and time.monotonic() >= deadline_at:
                assert deadline is not None
                raise start_deadline_error(rank, world_size, deadline)
            reader, writer = context.Pipe(duplex=False)
            stderr_reader, stderr_writer = context.Pipe(duplex=False)
            process = context.Process(
                target=run_rank,
                args=(rank, world_size, store.port, backend, timeout, threads)
                + (payload, writer, environment, lifeline_reader, stderr_writer),
                name=f"multigpu-rank-{rank}",
            )
            readers.append(reader)
            stderr.add(rank, stderr_reader)
            # Once started, only the child holds the writers: its exit shows as EOF.
            why = start_rank(process, deadline_at, (writer, stderr_writer))
            if why is not None:
                assert deadline is not None
                raise start_deadline_error(rank, world_size, deadline, why)
            processes.append(process)
            watchdog.watch(process.pid)
        lifeline_reader.close()
        return _collect(processes, readers, stderr, timeout, deadline, deadline_at)
    finally:
        _end_all(processes)
        watchdog.close()  # after _end_all: the ranks are reaped, their pids free
        lifeline_writer.close()
        lifeline_reader.close()
        stderr.pump()  # the last lines the ranks wrote
        stderr.close()
        for reader in readers:
            reader.close()
        del store


_PENDING = "pending"  # _next_report: the rank has not finished yet


def _next_report(
    rank: int,
    reader: Connection,
    process: mp.process.BaseProcess,
    started: set[int],
    returned: set[int],
) -> tuple | str | None:
    """The rank's final report (("ok", data) or ("error", report)), None when it
    ended without one, or _PENDING while it runs; notes in ``started`` and
    ``returned`` when its worker started and when it returned."""
    # Exited before we read: then everything it sent is already in the pipe.
    exited = process.exitcode is not None
    while reader.poll():  # data, or the end of the pipe
        message = _receive(reader)
        if message is None:
            return None
        if message[0] == "started":
            started.add(rank)
        elif message[0] == "returned":
            returned.add(rank)
        else:
            return message
    return None if exited else _PENDING


def _receive(reader: Connection) -> tuple | None:
    """The child's next message, or None if it closed the pipe."""
    try:
        return pickle.loads(reader.recv_bytes())
    except EOFError:
        return None


def _collect(
    processes: list,
    readers: list[Connection],
    stderr: StderrTails,
    timeout: float | None,
    deadline: float | None,
    deadline_at: float | None,
) -> list[Any]:
    """Wait for every rank's report; raise WorkerError for the root-cause failure,
    or DeadlineExceededError once ``deadline_at`` (time.monotonic()) has passed."""
    started_at = time.monotonic()
    world_size = len(processes)
    results: list[Any] = [None] * world_size
    pending = set(range(world_size))
    started: set[int] = set()  # ranks whose worker has started
    returned: set[int] = set()  # ranks whose worker has returned
    failures: list[Failure] = []
    grace_end = None
    first_failure_at = None
    while pending:
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            break
        if grace_end is None and deadline_at is not None and now >= deadline_at:
            assert deadline is not None
            raise deadline_error(processes, pending, returned, stderr, deadline)
        end = grace_end if grace_end is not None else deadline_at
        wait_s = _POLL_S if end is None else max(0.0, min(_POLL_S, end - now))
        waitables = [readers[r] for r in pending] + [
            processes[r].sentinel for r in pending
        ]
        wait(waitables + stderr.waitables(), timeout=wait_s)
        stderr.pump()
        for rank in sorted(pending):
            process = processes[rank]
            report = _next_report(rank, readers[rank], process, started, returned)
            if report == _PENDING:
                continue
            pending.discard(rank)
            if report is not None and report[0] == "ok":
                try:
                    results[rank] = pickle.loads(report[1])
                    continue
                except Exception as exc:
                    failure = Failure(rank, None, started=True, unpickle_error=exc)
            else:
                if report is None:
                    process.join(timeout=2.0)
                failure = Failure(
                    rank,
                    process.exitcode,
                    report[1] if report is not None else None,
                    started=rank in started,
                )
            failures.append(failure)
            if first_failure_at is None:
                first_failure_at = time.monotonic()
            # A connection a peer closed is always another rank's end: wait longer
            # for that rank's own report (a busy machine can take a second or two).
            symptoms_only = all(f.priority >= 3 for f in failures)
            grace = _PEER_CLOSED_GRACE_S if symptoms_only else _FAILURE_GRACE_S
            grace_end = first_failure_at + grace
    if failures:
        stderr.pump()
        waited_long_enough = (
            timeout is not None and time.monotonic() - started_at >= timeout
        )
        raise failure_error(
            failures, pending, returned, world_size, stderr, waited_long_enough
        )
    return results


def _end_all(processes: list) -> None:
    """Kill every child that still runs, with anything it started, and reap them.

    Each child leads its own process group (see run_rank), but a process it started
    in a session of its own is not in it: so the children still running are
    stopped and everything below them is found and killed too (_process_tree)."""
    running = [p for p in processes if p.pid is not None and p.exitcode is None]
    found = {_process_tree.process(process.pid) for process in running}
    groups = [process.pid for process in processes if process.pid is not None]
    _process_tree.end_processes(found - {None}, groups if hasattr(os, "killpg") else [])
    for process in running:
        if process.is_alive():
            process.kill()
    for process in processes:
        if process.pid is not None:
            process.join()
