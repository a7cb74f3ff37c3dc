"""Support code that starts worker processes for notebooks 07-11: you may skip it.

Nothing in this file is about data parallelism. In a script you would use PyTorch's
own launchers; this module stands in for them where they do not fit a notebook:

- ``torch.multiprocessing.spawn(fn, args, nprocs)`` starts processes from Python
  (https://github.com/pytorch/pytorch/blob/main/torch/multiprocessing/spawn.py).
  :func:`spawn` starts them too, and also joins them into a process group, hands
  back each rank's return value in rank order, and turns a rank that raises, dies
  or never joins into one clear error within seconds.
- ``torchrun --nproc-per-node=N script.py`` starts a script once per device and
  sets up the rendezvous through environment variables
  (https://github.com/pytorch/pytorch/blob/main/torch/distributed/run.py).
  :func:`run_torchrun` runs it as a subprocess and returns what it printed.

``notebooks/07_collectives_from_scratch.ipynb`` shows how to use it; every notebook
and test that runs real processes does. The workers it runs live in
:mod:`multigpu.workers`. What follows is the exact contract, then the code: the
child side (what runs in each rank), the parent side, and torchrun.

Contract
--------
``spawn(worker, world_size, *args, backend="auto", timeout=30.0, threads=1) -> list``

- Runs ``worker(rank, world_size, *args)`` in ``world_size`` fresh processes and
  returns the workers' return values as a list ordered by rank. Return values and
  ``args`` must be picklable. The processes never copy the caller's memory: they are
  forked from a clean server process that has imported torch once (multiprocessing
  start method "forkserver"; "spawn" where that does not exist, or when
  ``launch.START_METHOD = "spawn"``), which makes a launch take a fraction of a
  second instead of one torch import per rank. They get the caller's current
  environment variables and ``sys.path``.
- ``worker`` must be a top-level function of an importable module; a worker defined
  in a notebook or in ``__main__`` is refused with :class:`WorkerNotImportableError`
  before any process starts.
- Inside each worker the default process group is already initialised and it is
  destroyed after the worker returns. ``backend="auto"`` means
  :func:`multigpu.devices.choose_backend`: "gloo" on CPU, "nccl" with GPUs (rank r
  then uses ``cuda:r``).
- Rendezvous: the parent owns a ``torch.distributed.TCPStore`` on 127.0.0.1 with an
  OS-assigned port (port 0), so launches running at the same time never clash; the
  children connect to it and call ``dist.init_process_group(backend, store=...,
  rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))``.
- ``timeout`` (seconds) bounds the rendezvous and every collective: a rank that
  never joins makes the others fail after ``timeout`` instead of hanging.
- A rank that raises or dies (even from SIGKILL) makes ``spawn`` raise
  :class:`WorkerError` within seconds; it names the rank, and carries the rank's
  traceback (``error.traceback``, also chained as ``error.__cause__``). The other
  ranks are then ended. ``error.timed_out`` says whether the rank gave up waiting
  for its peers after ``timeout`` (see :func:`_is_timeout`), and
  ``error.missing_ranks`` lists the ranks that were still running without having
  reported anything when the error was raised (the usual suspects of a timeout).
  Before ``spawn`` returns or raises, every rank is ended and reaped, and anything
  a rank started is killed (each rank leads its own process group). Only the
  forkserver itself stays, one per session, until Python exits.
- Each child limits its threads to ``threads`` (``torch.set_num_threads`` and
  ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``), so results do not depend on the core
  count.

``run_torchrun(module, nproc_per_node, *args, timeout=120.0, threads=1, check=True)
-> subprocess.CompletedProcess[str]``

- Runs ``python -m torch.distributed.run --standalone --nproc-per-node=N -m module
  args...`` with ``OMP_NUM_THREADS=threads`` and returns its captured, decoded
  stdout and stderr. ``check=True`` raises :class:`TorchrunError` (with the output)
  on a non-zero exit; a run longer than ``timeout`` seconds is killed, with every
  process it started, and raises :class:`TorchrunError` too.

This module imports torch lazily, so that with "spawn" a child sets its thread limits
before torch loads.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

HOST = "127.0.0.1"
# "forkserver": children forked from a server process that imported torch once;
# "spawn": each child starts a new interpreter and imports torch (seconds per rank).
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# After the first failure, how long to keep listening for the other ranks' reports,
# so that the error shown is the root cause and not a peer's "connection reset".
_FAILURE_GRACE_S = 0.5
_POLL_S = 0.2  # how often the parent checks exit codes while waiting
_WATCHDOG_S = 0.5  # how often a child checks that its parent is still alive


class WorkerError(RuntimeError):
    """A rank raised or died: ``rank``, ``exitcode`` (None when it reported an
    exception), its ``traceback`` text, ``failures`` (every failure seen),
    ``timed_out`` (it gave up waiting for its peers) and ``missing_ranks`` (ranks
    still silent when the error was raised, sorted) (07)."""

    def __init__(
        self,
        message: str,
        rank: int,
        exitcode: int | None,
        tb: str,
        timed_out: bool = False,
        missing_ranks: Sequence[int] = (),
    ):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = tb
        self.failures: list[str] = []
        self.timed_out = timed_out
        self.missing_ranks = sorted(missing_ranks)


class WorkerNotImportableError(ValueError):
    """The worker cannot be imported by a fresh process (notebook, lambda, nested)."""


class TorchrunError(RuntimeError):
    """A torchrun run failed or timed out; ``output`` holds what it printed."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


class _RemoteTraceback(Exception):
    """Shows a child's traceback as the cause of a :class:`WorkerError`."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


# ----------------------------------------------------------------------------------
# The child side


def _watch_parent(parent_pid: int) -> None:
    """End this child (and its process group) once its parent has gone."""
    while True:
        time.sleep(_WATCHDOG_S)
        if os.getppid() != parent_pid:  # reparented: the parent died
            if os.getpgid(0) == os.getpid():
                os.killpg(0, signal.SIGKILL)
            os._exit(1)


def _run_rank(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float,
    threads: int,
    payload: bytes,
    writer: Connection,
    environment: dict[str, str],
) -> None:
    """Body of one child process: set limits, join the group, run, report."""
    # The caller's environment as it is now (a forkserver started earlier has an older
    # one), with thread limits set before torch loads (under "spawn").
    os.environ.clear()
    os.environ.update(environment)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    if hasattr(os, "setpgid"):
        # Own process group: the parent can end this rank and all it started, and a
        # Ctrl-C in a terminal reaches only the parent (which then ends the ranks).
        os.setpgid(0, 0)
        watchdog = threading.Thread(
            target=_watch_parent, args=(os.getppid(),), daemon=True
        )
        watchdog.start()

    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    rendezvous_start = time.monotonic()  # nothing can time out sooner than timeout
    try:
        worker, args = pickle.loads(payload)
        device = None
        if backend == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        store = dist.TCPStore(
            HOST, port, is_master=False, timeout=timedelta(seconds=timeout)
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
            device_id=device,  # nccl: connect now, one GPU per rank
        )
        # Every rank has finished connecting before any starts: without this, a rank
        # whose worker returns at once can exit while a peer is still connecting to
        # it, and that peer fails with "Connection closed by peer".
        dist.barrier()
        result = worker(rank, world_size, *args)
        try:
            data = pickle.dumps(result)
        except Exception as exc:
            raise TypeError(
                f"Rank {rank} returned a {type(result).__name__} that cannot be "
                f"pickled ({exc}). Return tensors, numbers, strings, lists or dicts."
            ) from exc
        dist.destroy_process_group()
        writer.send_bytes(pickle.dumps(("ok", data)))
    except BaseException as exc:
        waited_s = time.monotonic() - rendezvous_start
        report = (
            "error",
            type(exc).__name__,
            str(exc),
            traceback.format_exc(),
            _is_communication_error(exc),
            _is_timeout(exc, waited_s, timeout),
        )
        writer.send_bytes(pickle.dumps(report))
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter shutdown: it could block on a broken process group.
        os._exit(1)
    writer.close()


def _is_communication_error(exc: BaseException) -> bool:
    """True for errors raised inside torch.distributed (often a peer's symptom)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "torch/distributed/" in frames[-1].filename.replace(
        "\\", "/"
    )


def _is_timeout(exc: BaseException, waited_s: float, timeout: float) -> bool:
    """True when ``exc`` is torch.distributed giving up on its peers after
    ``timeout`` seconds, ``waited_s`` seconds after the rendezvous began.

    torch has no single exception type for this. A store wait (the rendezvous
    included) raises ``DistStoreError``; gloo, a plain ``RuntimeError`` "Timed out
    waiting ..."; nccl, when it raises rather than ending the process, a
    ``DistBackendError`` that mentions the timeout. So: nothing times out before
    ``timeout`` seconds have passed; after that, a Python ``TimeoutError``, a store
    error, or an error from torch.distributed whose text says it timed out.
    """
    import torch.distributed as dist

    if waited_s < timeout:
        return False
    if isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, dist.DistStoreError) and not isinstance(
        exc, dist.QueueEmptyError
    ):
        return True
    if not _is_communication_error(exc):
        return False
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


# ----------------------------------------------------------------------------------
# The parent side


def _context() -> mp.context.BaseContext:
    """The multiprocessing context of START_METHOD; a forkserver preloads torch."""
    context = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        context.set_forkserver_preload(["torch", "torch.distributed", __name__])
    return context


def _check_importable(worker: Callable[..., Any]) -> None:
    """Raise WorkerNotImportableError unless a fresh process can import ``worker``."""
    if not callable(worker):
        raise TypeError(
            f"spawn needs a function as its worker, got {type(worker).__name__}. "
            "Pass a function defined at the top level of a module."
        )
    module_name = getattr(worker, "__module__", None)
    qualname = getattr(worker, "__qualname__", None) or repr(worker)
    fix = (
        "Move it into a module file (for example src/multigpu/your_module.py), "
        "then import it and pass the imported function."
    )
    if module_name in (None, "__main__", "__mp_main__"):
        raise WorkerNotImportableError(
            f"The worker {qualname!r} is defined in a notebook or script (__main__), "
            f"which the new processes cannot import. {fix}"
        )
    if "<" in qualname:  # "<lambda>" or "<locals>"
        raise WorkerNotImportableError(
            f"The worker {qualname!r} is a lambda or a nested function, which the "
            f"new processes cannot import. {fix}"
        )
    found: Any = None
    try:
        found = importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not worker:
        raise WorkerNotImportableError(
            f"The worker {qualname!r} cannot be found as {module_name}.{qualname}, "
            f"so the new processes cannot import it. {fix}"
        )


def _check_arguments(world_size: int, timeout: float, threads: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}.")
    if world_size < 1:
        raise ValueError(
            f"world_size must be at least 1, got {world_size}. "
            "Ask for as many processes as you want ranks."
        )
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds: {timeout!r}.")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}.")


def _resolve_backend(backend: str, world_size: int) -> str:
    from .devices import choose_backend, cuda_device_count

    if backend == "auto":
        backend = choose_backend()
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"Unknown backend {backend!r}. Use 'auto', 'gloo' or 'nccl'.")
    if backend == "nccl" and world_size > cuda_device_count():
        raise ValueError(
            f"nccl needs one GPU per rank: world_size={world_size} but this machine "
            f"has {cuda_device_count()} GPU(s). Use fewer ranks or backend='gloo'."
        )
    return backend


def spawn(
    worker: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "auto",
    timeout: float = 30.0,
    threads: int = 1,
) -> list[Any]:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` processes; return
    their results ordered by rank (07-11). See the module docstring."""
    _check_importable(worker)
    _check_arguments(world_size, timeout, threads)
    backend = _resolve_backend(backend, world_size)
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
        timeout=timedelta(seconds=timeout),
    )
    context = _context()
    processes: list[mp.process.BaseProcess] = []
    readers: list[Connection] = []
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_run_rank,
                args=(rank, world_size, store.port, backend, timeout, threads)
                + (payload, writer, dict(os.environ)),
                name=f"multigpu-rank-{rank}",
            )
            readers.append(reader)
            processes.append(process)
            process.start()
            writer.close()  # only the child holds it now: its exit shows as EOF
        return _collect(processes, readers, timeout)
    finally:
        _end_all(processes)
        for reader in readers:
            reader.close()
        del store


class _Failure:
    """What the parent learnt about one failed rank."""

    def __init__(self, rank: int, exitcode: int | None, report: tuple | None):
        self.rank = rank
        self.exitcode = exitcode
        # ("error", name, message, traceback, is_comm_error, timed_out)
        self.report = report

    @property
    def priority(self) -> int:
        """0: the worker's own exception, 1: died, 2: a peer's communication error."""
        if self.report is None:
            return 1
        return 2 if self.report[4] else 0

    def describe(self, world_size: int) -> tuple[str, str]:
        """The headline and the traceback text of this failure."""
        if self.report is not None:
            _, name, message, tb = self.report[:4]
            return f"Rank {self.rank} of {world_size} failed with {name}: {message}", tb
        code = self.exitcode
        if code is not None and code < 0:
            how = (
                f"was killed by {signal.Signals(-code).name} without reporting an error"
            )
        else:
            how = (
                f"exited with code {code} before it could report (see its stderr; a "
                "script that calls spawn needs an `if __name__ == '__main__':` guard)"
            )
        headline = f"Rank {self.rank} of {world_size} {how}"
        return headline, f"{headline} (no Python traceback: the process died).\n"


def _receive(reader: Connection) -> tuple | None:
    """The child's report, or None if it closed the pipe without one."""
    try:
        return pickle.loads(reader.recv_bytes())
    except EOFError:
        return None


def _collect(
    processes: list, readers: list[Connection], timeout: float = float("inf")
) -> list[Any]:
    """Wait for every rank's report; raise WorkerError for the root-cause failure."""
    started = time.monotonic()
    world_size = len(processes)
    results: list[Any] = [None] * world_size
    pending = set(range(world_size))
    failures: list[_Failure] = []
    grace_end = None
    while pending:
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            break
        wait_s = _POLL_S if grace_end is None else min(_POLL_S, grace_end - now)
        waitables = [readers[r] for r in pending] + [
            processes[r].sentinel for r in pending
        ]
        wait(waitables, timeout=wait_s)
        for rank in sorted(pending):
            reader, process = readers[rank], processes[rank]
            if reader.poll():
                report = _receive(reader)
            elif process.exitcode is not None and not reader.poll():
                report = None
            else:
                continue
            pending.discard(rank)
            if report is not None and report[0] == "ok":
                results[rank] = pickle.loads(report[1])
                continue
            if report is None:
                process.join(timeout=2.0)
            failures.append(_Failure(rank, process.exitcode, report))
            if grace_end is None:
                grace_end = time.monotonic() + _FAILURE_GRACE_S
    if failures:
        waited_long_enough = time.monotonic() - started >= timeout
        raise _failure_error(failures, pending, world_size, waited_long_enough)
    return results


def _failure_error(
    failures: list[_Failure],
    silent: set[int],
    world_size: int,
    waited_long_enough: bool = False,
) -> WorkerError:
    """One WorkerError for the most telling failure; mention the others briefly.

    It timed out if the rank said so (see :func:`_is_timeout`), or if it failed in
    torch.distributed after ``timeout`` seconds while other ranks were still running
    without a word: it was waiting for them.
    """
    first = min(failures, key=lambda f: (f.priority, f.rank))
    timed_out = first.priority == 2 and (
        bool(first.report[5]) or (bool(silent) and waited_long_enough)
    )
    headline, tb = first.describe(world_size)
    message = headline
    if first.priority == 2 and silent:
        message += (
            f". Rank(s) {sorted(silent)} had not reported: a rank that never joins "
            "a collective makes the others time out"
        )
    error = WorkerError(
        message, first.rank, first.exitcode, tb, timed_out, missing_ranks=silent
    )
    # Everything seen, for the curious; left out of the message to keep it stable.
    error.failures = [failure.describe(world_size)[0] for failure in failures]
    error.__cause__ = _RemoteTraceback(tb)
    return error


def _end_all(processes: list) -> None:
    """Kill every child that still runs, with anything it started, and reap them."""
    for process in processes:
        if process.pid is None:  # never started
            continue
        if hasattr(os, "killpg"):
            try:
                # Each child leads its own process group (see _run_rank).
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if process.is_alive():
            process.kill()
    for process in processes:
        if process.pid is not None:
            process.join()


# ----------------------------------------------------------------------------------
# torchrun


def run_torchrun(
    module: str,
    nproc_per_node: int,
    *args: Any,
    timeout: float = 120.0,
    threads: int = 1,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``torchrun --standalone --nproc-per-node=N -m module args`` as a
    subprocess; return its stdout and stderr as text (09-11)."""
    _check_arguments(nproc_per_node, timeout, threads)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        "-m",
        module,
        *map(str, args),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # one process group: torchrun and all its workers
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
        raise TorchrunError(
            f"torchrun -m {module} did not finish within {timeout} s and was "
            "stopped. Raise timeout=, or look for a rank that never joins.",
            stdout + stderr,
        ) from None
    finally:
        _kill_group(process.pid)  # workers that outlived torchrun
        if process.poll() is None:
            process.kill()
            process.wait()
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        raise TorchrunError(
            f"torchrun -m {module} exited with code {result.returncode}; its output "
            f"ends with:\n{tail}",
            stdout + stderr,
        )
    return result


def _kill_group(pid: int) -> None:
    if hasattr(os, "killpg"):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
