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
and test that runs real processes does. The workers of notebooks 07-08 and of the
tests live in :mod:`multigpu.workers`; each recipe module (``ddp``, ``zero``, ...)
keeps its own. What follows is the exact contract, then the code: the
child side (what runs in each rank), the parent side, how the parent turns what it
saw into one error, and torchrun.

Contract
--------
``spawn(worker, world_size, *args, backend="auto", timeout=30.0, threads=1,
deadline=300.0) -> list``

- Runs ``worker(rank, world_size, *args)`` in ``world_size`` fresh processes and
  returns the workers' return values as a list ordered by rank. Return values and
  ``args`` must be picklable. The processes never copy the caller's memory: they are
  forked from a clean server process that has imported torch once (multiprocessing
  start method "forkserver"; "spawn" where that does not exist, or when
  ``launch.START_METHOD = "spawn"``), which makes a launch take a fraction of a
  second instead of one torch import per rank. They get the caller's current
  environment variables and ``sys.path``, plus what a laptop needs and the caller
  has not set (:func:`_laptop_environment`: ``GLOO_SOCKET_IFNAME=lo0`` on macOS).
- ``worker`` must be a top-level function of an importable module; a worker defined
  in a notebook or in ``__main__`` is refused with :class:`WorkerNotImportableError`
  before any process starts.
- Inside each worker the default process group is already initialised and it is
  destroyed after the worker returns. ``backend="auto"`` means
  :func:`multigpu.core.devices.choose_backend`: "gloo" on CPU, "nccl" with GPUs (rank r
  then uses ``cuda:r``).
- Rendezvous: the parent owns a ``torch.distributed.TCPStore`` on 127.0.0.1 with an
  OS-assigned port (port 0), so launches running at the same time never clash; the
  children connect to it and call ``dist.init_process_group(backend, store=...,
  rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))``.
- ``timeout`` (seconds) bounds the rendezvous and every collective: a rank that
  never joins makes the others fail after ``timeout`` instead of hanging.
  ``timeout=None`` means no timeout (torch gets a year); ``float("inf")`` is refused
  with a message that says so, because torch cannot take it.
- ``deadline`` (seconds, counted from the call) bounds the whole launch, which the
  timeout cannot: a rank stuck outside any collective (an endless loop, a blocking
  read) never lets its peers time out. Past the deadline every rank is stopped and
  :class:`DeadlineExceededError` (a :class:`WorkerError`) names the ranks that were
  still running (``error.missing_ranks``), with the Python stack of the first of
  them in ``error.traceback`` where the platform can dump it. ``None`` means no
  deadline; ``float("inf")`` is refused like the timeout's.
- A ``world_size`` above 4 ranks per CPU core gives a ``RuntimeWarning``: such a
  launch crawls, and its collectives may reach their timeout.
- A rank that raises or dies (even from SIGKILL) makes ``spawn`` raise
  :class:`WorkerError` within seconds; it names the rank, and carries the rank's
  traceback (``error.traceback``, also chained as ``error.__cause__``). The other
  ranks are then ended. ``error.timed_out`` says whether the rank gave up waiting
  for its peers after ``timeout`` (see :func:`_is_timeout`), or the launch ran past
  its deadline; ``error.missing_ranks`` lists the ranks that were still running
  without having reported anything when the error was raised (the usual suspects of
  a timeout); ``error.returned_ranks`` those whose worker had returned.
- The error says what the parent knows, not only what the failing rank saw:

  * a rank that failed in a collective after a peer's worker returned normally is a
    *collective mismatch* (the ranks called different collectives), and the error
    says so and names the rank that returned, instead of gloo's "Connection closed
    by peer ... remote worker crashing";
  * each rank's stderr (file descriptor 2) goes through the parent, which passes it
    on to its own stderr and keeps its end (``error.stderr``): a rank killed by a
    signal, for example SIGABRT when gloo finds tensors of different sizes in one
    collective, gets the last lines it printed (gloo's own explanation) in the
    message;
  * a rank that exits while running its worker (``os._exit(0)``), one whose
    exception cannot be turned into text, and a result that cannot be unpickled in
    the caller each get their own message, naming the rank.
- Before ``spawn`` returns or raises, every rank is ended and reaped, and anything
  a rank started is killed (each rank leads its own process group). Only the
  forkserver itself stays, one per session, until Python exits.
- If the caller itself dies, by any signal (SIGKILL, SIGTERM, the out-of-memory
  killer ending a Jupyter kernel), every rank ends within a fraction of a second,
  with everything it started, and the forkserver and multiprocessing's resource
  tracker follow: each rank reads a *lifeline* pipe whose write end only the caller
  holds, and the operating system closes it when the caller dies
  (``bench/orphans.py`` measures it).
- Each child limits its threads to ``threads`` (``torch.set_num_threads`` and
  ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``), so results do not depend on the core
  count.

``run_torchrun(module, nproc_per_node, *args, timeout=120.0, threads=1, check=True)
-> subprocess.CompletedProcess[str]``

- Runs ``python -m torch.distributed.run --standalone --nproc-per-node=N -m module
  args...`` with ``OMP_NUM_THREADS=threads`` (and, unless the caller set them,
  ``GLOO_SOCKET_IFNAME=lo0`` on macOS and ``USE_LIBUV=0`` on Windows:
  :func:`_laptop_environment`) and returns its captured, decoded stdout and stderr.
  ``check=True`` raises :class:`TorchrunError` (with the output) on a non-zero exit;
  a run longer than ``timeout`` seconds is stopped, with every process it started,
  and raises :class:`TorchrunError` too. ``options`` (e.g. ``["--max-restarts=3"]``),
  ``rendezvous`` (options that replace ``--standalone``) and ``env`` (more
  environment variables) serve notebook 11.
- :func:`start_torchrun` starts the same command without waiting (its output to a
  file), and :func:`stop_torchrun` ends it: SIGTERM first, on which torchrun stops
  the workers it started in sessions of their own, then SIGKILL to its group.
- A script run by torchrun ends with :func:`exit_rank` after
  ``dist.destroy_process_group()``: a rank that built a DDP model and simply
  returns can abort while Python shuts down, after its work is done.

This module imports torch lazily, so that with "spawn" a child sets its thread limits
before torch loads.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import math
import multiprocessing as mp
import numbers
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from multigpu.core.checks import check_positive_int

HOST = "127.0.0.1"
# "forkserver": children forked from a server process that imported torch once;
# "spawn": each child starts a new interpreter and imports torch (seconds per rank).
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
DEFAULT_DEADLINE_S = 300.0  # spawn's default bound on a whole launch, in seconds
RANKS_PER_CORE = 4  # more ranks than this per CPU core: spawn warns
# What torch gets for timeout=None: a year (torch needs a finite timedelta, and much
# longer ones overflow inside it).
_NO_TIMEOUT = timedelta(days=365)
# After the first failure, how long to keep listening for the other ranks' reports,
# so that the error shown is the root cause and not a peer's "connection reset".
_FAILURE_GRACE_S = 0.5
_POLL_S = 0.2  # how often the parent checks exit codes while waiting
_STDERR_TAIL_BYTES = 16_384  # how much of each rank's stderr the parent keeps
_STDERR_LINES_SHOWN = 5  # lines of a dead rank's stderr quoted in its error message
_STACK_WAIT_S = 1.0  # at the deadline, how long to wait for a stuck rank's stack


class WorkerError(RuntimeError):
    """A rank raised or died: ``rank``, ``exitcode`` (None when it reported an
    exception), its ``traceback`` text, ``failures`` (every failure seen),
    ``timed_out`` (it gave up waiting for its peers, or the launch ran past its
    deadline), ``missing_ranks`` (ranks still silent when the error was raised,
    sorted), ``returned_ranks`` (ranks whose worker had returned, sorted) and
    ``stderr`` (the end of what the rank printed to stderr, often "") (07)."""

    def __init__(
        self,
        message: str,
        rank: int,
        exitcode: int | None,
        tb: str,
        timed_out: bool = False,
        missing_ranks: Iterable[int] = (),
        returned_ranks: Iterable[int] = (),
        stderr: str = "",
    ):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode
        self.traceback = tb
        self.failures: list[str] = []
        self.timed_out = timed_out
        self.missing_ranks = sorted(missing_ranks)
        self.returned_ranks = sorted(returned_ranks)
        self.stderr = stderr


class DeadlineExceededError(WorkerError):
    """The launch ran past its ``deadline`` (seconds) and was stopped (07).

    ``missing_ranks`` were still running; ``rank`` is the first of them and
    ``traceback`` its Python stack at the deadline, where it could be dumped.
    ``timed_out`` is True and ``exitcode`` None.
    """

    def __init__(
        self,
        message: str,
        rank: int,
        tb: str,
        deadline: float,
        missing_ranks: Iterable[int],
        returned_ranks: Iterable[int] = (),
        stderr: str = "",
    ):
        super().__init__(
            message,
            rank,
            None,
            tb,
            timed_out=True,
            missing_ranks=missing_ranks,
            returned_ranks=returned_ranks,
            stderr=stderr,
        )
        self.deadline = deadline


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
#
# What a rank tells the parent through its pipe, in order: ("started",) just before
# the worker runs, ("returned",) once it has returned, then ("ok", pickled result)
# or ("error", report) (see _error_report). A rank that dies sends nothing more; the
# parent then learns from its exit code, and from its stderr, which goes through the
# parent too.


def _watch_lifeline(lifeline: Connection) -> None:
    """End this rank, and everything it started, once the caller of spawn is gone.

    Only the caller holds the write end of the lifeline and it never writes to it,
    so this read returns (at end of file) only once that end is closed: by spawn when
    it finishes, or by the operating system when the caller dies, whatever killed it.
    The rank's parent process cannot tell: under forkserver it is the forkserver,
    which lives on as long as ranks do.
    """
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    if hasattr(os, "killpg") and os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)  # this rank and every process it started
    os._exit(1)


def _send(writer: Connection, message: tuple) -> None:
    writer.send_bytes(pickle.dumps(message))


def _run_rank(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout: float | None,
    threads: int,
    payload: bytes,
    writer: Connection,
    environment: dict[str, str],
    lifeline: Connection,
    stderr_writer: Connection,
) -> None:
    """Body of one child process: set limits, join the group, run, report."""
    # Everything this process writes to stderr, C++ included (gloo's last words
    # before an abort), goes to the parent, which passes it on and keeps its end.
    os.dup2(stderr_writer.fileno(), 2)
    stderr_writer.close()
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
    threading.Thread(
        target=_watch_lifeline, args=(lifeline,), daemon=True, name="lifeline"
    ).start()
    if hasattr(faulthandler, "register"):
        # At the deadline the parent sends SIGUSR1: this rank then prints the stack
        # of every thread to stderr, even from inside C code that holds the GIL.
        faulthandler.register(signal.SIGUSR1, all_threads=True)

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
            HOST, port, is_master=False, timeout=_as_timedelta(timeout)
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=_as_timedelta(timeout),
            device_id=device,  # nccl: connect now, one GPU per rank
        )
        # Every rank has finished connecting before any starts: without this, a rank
        # whose worker returns at once can exit while a peer is still connecting to
        # it, and that peer fails with "Connection closed by peer".
        dist.barrier()
        _send(writer, ("started",))
        result = worker(rank, world_size, *args)
        _send(writer, ("returned",))
        try:
            data = pickle.dumps(result)
        except Exception as exc:
            raise TypeError(
                f"Rank {rank} returned a {type(result).__name__} that cannot be "
                f"pickled ({exc}). Return tensors, numbers, strings, lists or dicts."
            ) from exc
        dist.destroy_process_group()
        _send(writer, ("ok", data))
    except BaseException as exc:
        waited_s = time.monotonic() - rendezvous_start
        _send(writer, ("error", _error_report(exc, waited_s, timeout)))
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter shutdown: it could block on a broken process group.
        os._exit(1)
    writer.close()


def _error_report(exc: BaseException, waited_s: float, timeout: float | None) -> dict:
    """What the parent needs to know about ``exc``, as plain strings and flags.

    Never raises, even for an exception whose ``__str__`` does: its ``message`` is
    then None and ``unprintable`` says what ``str()`` raised.
    """
    message: str | None
    unprintable = None
    try:
        message = str(exc)
    except Exception as str_error:
        message = None
        unprintable = _describe_exception(str_error)
    try:
        communication = _is_communication_error(exc)
        timed_out = _is_timeout(exc, waited_s, timeout)
    except Exception:  # a text that cannot be read is no sign of a timeout
        communication = timed_out = False
    return {
        "name": type(exc).__name__,
        "message": message,
        "unprintable": unprintable,
        "traceback": traceback.format_exc(),  # robust: "<exception str() failed>"
        "communication": communication,
        "timed_out": timed_out,
    }


def _describe_exception(exc: BaseException) -> str:
    """``"Name: message"``, or just the name when even that text cannot be made."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _is_communication_error(exc: BaseException) -> bool:
    """True for errors raised inside torch.distributed (often a peer's symptom)."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and "torch/distributed/" in frames[-1].filename.replace(
        "\\", "/"
    )


def _is_timeout(exc: BaseException, waited_s: float, timeout: float | None) -> bool:
    """True when ``exc`` is torch.distributed giving up on its peers after
    ``timeout`` seconds, ``waited_s`` seconds after the rendezvous began.

    torch has no single exception type for this. A store wait (the rendezvous
    included) raises ``DistStoreError``; gloo, a plain ``RuntimeError`` "Timed out
    waiting ..."; nccl, when it raises rather than ending the process, a
    ``DistBackendError`` that mentions the timeout. So: nothing times out before
    ``timeout`` seconds have passed (nor ever, with ``timeout=None``); after that, a
    Python ``TimeoutError``, a store error, or an error from torch.distributed whose
    text says it timed out.
    """
    import torch.distributed as dist

    if timeout is None or waited_s < timeout:
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


def _as_timedelta(timeout: float | None) -> timedelta:
    """The timedelta torch gets for ``timeout`` seconds (None: no timeout)."""
    return _NO_TIMEOUT if timeout is None else timedelta(seconds=timeout)


# ----------------------------------------------------------------------------------
# The parent side


def _context() -> mp.context.BaseContext:
    """The multiprocessing context of START_METHOD; a forkserver preloads torch."""
    context = mp.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        context.set_forkserver_preload(["torch", "torch.distributed", __name__])
    return context


def check_importable(worker: Callable[..., Any]) -> None:
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


def _check_seconds(name: str, value: Any, none_means: str) -> None:
    """``value`` must be a positive, finite number of seconds, or None."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds, or None for {none_means}; got "
            f"{value!r}."
        )
    if math.isinf(value) and value > 0:
        raise ValueError(
            f"{name}=inf cannot be used: torch.distributed and the launcher need a "
            f"finite number of seconds. For {none_means}, pass {name}=None."
        )
    if not value > 0:
        raise ValueError(
            f"{name} must be a positive number of seconds, got {value!r}. For "
            f"{none_means}, pass {name}=None."
        )


def _check_arguments(world_size: int, timeout: float | None, threads: int) -> None:
    check_positive_int(
        "world_size", world_size, "Ask for as many processes as you want ranks."
    )
    _check_seconds("timeout", timeout, "no timeout")
    check_positive_int(
        "threads",
        threads,
        "Pass how many CPU threads each rank may use, e.g. threads=1.",
    )


def _laptop_environment(
    env: Mapping[str, str], platform: str, torchrun: bool = False
) -> dict[str, str]:
    """A copy of ``env`` with what laptops need for ranks on this machine, where
    the user has not set it (a value already in ``env`` is never changed):

    - macOS (``platform == "darwin"``): ``GLOO_SOCKET_IFNAME=lo0``. gloo otherwise
      looks up the machine's host name, which often fails on a laptop; every rank of
      :func:`spawn` and of ``torchrun --standalone`` is on 127.0.0.1, so the loopback
      interface is right.
    - Windows (``"win32"``), for torchrun only (``torchrun=True``): ``USE_LIBUV=0``,
      because PyTorch's Windows builds lack libuv and torchrun otherwise stops with
      "use_libuv was requested but PyTorch was built without libuv support".

    ``platform`` is a value of ``sys.platform``; any other platform gets ``env``
    unchanged."""
    env = dict(env)
    if platform == "darwin":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo0")
    if torchrun and platform == "win32":
        env.setdefault("USE_LIBUV", "0")
    return env


def _resolve_backend(backend: str, world_size: int) -> str:
    from multigpu.core.devices import choose_backend, cuda_device_count

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


def _cpu_count() -> int:
    return os.cpu_count() or 1


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
    timeout: float | None = 30.0,
    threads: int = 1,
    deadline: float | None = DEFAULT_DEADLINE_S,
) -> list[Any]:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` processes; return
    their results ordered by rank (07-11). ``timeout`` bounds the rendezvous and
    each collective, ``deadline`` the whole launch (seconds; None: no bound). See
    the module docstring."""
    start = time.monotonic()
    check_importable(worker)
    _check_arguments(world_size, timeout, threads)
    _check_seconds("deadline", deadline, "no deadline")
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
        timeout=_as_timedelta(timeout),
    )
    context = _context()
    environment = _laptop_environment(os.environ, sys.platform)
    # Only this process ever holds the lifeline's write end: when it closes, because
    # spawn is done or because this process died, every rank ends (_watch_lifeline).
    lifeline_reader, lifeline_writer = context.Pipe(duplex=False)
    processes: list[mp.process.BaseProcess] = []
    readers: list[Connection] = []
    stderr = _StderrTails()
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            stderr_reader, stderr_writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_run_rank,
                args=(rank, world_size, store.port, backend, timeout, threads)
                + (payload, writer, environment, lifeline_reader, stderr_writer),
                name=f"multigpu-rank-{rank}",
            )
            readers.append(reader)
            stderr.add(rank, stderr_reader)
            processes.append(process)
            process.start()
            writer.close()  # only the child holds it now: its exit shows as EOF
            stderr_writer.close()
        lifeline_reader.close()
        deadline_at = None if deadline is None else start + deadline
        return _collect(processes, readers, stderr, timeout, deadline, deadline_at)
    finally:
        _end_all(processes)
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
    stderr: _StderrTails,
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
    failures: list[_Failure] = []
    grace_end = None
    while pending:
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            break
        if grace_end is None and deadline_at is not None and now >= deadline_at:
            assert deadline is not None
            raise _deadline_error(processes, pending, returned, stderr, deadline)
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
                    failure = _Failure(rank, None, started=True, unpickle_error=exc)
            else:
                if report is None:
                    process.join(timeout=2.0)
                failure = _Failure(
                    rank,
                    process.exitcode,
                    report[1] if report is not None else None,
                    started=rank in started,
                )
            failures.append(failure)
            if grace_end is None:
                grace_end = time.monotonic() + _FAILURE_GRACE_S
    if failures:
        stderr.pump()
        waited_long_enough = (
            timeout is not None and time.monotonic() - started_at >= timeout
        )
        raise _failure_error(
            failures, pending, returned, world_size, stderr, waited_long_enough
        )
    return results


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


class _StderrTails:
    """Each rank's stderr: passed on to this process's stderr as it arrives, and its
    last bytes kept for the error messages."""

    def __init__(self) -> None:
        self.forward = True  # pass what arrives on to this process's stderr
        self._open: dict[int, Connection] = {}
        self._tails: dict[int, bytearray] = {}
        self._received: dict[int, int] = {}  # bytes received in all, per rank

    def add(self, rank: int, reader: Connection) -> None:
        os.set_blocking(reader.fileno(), False)
        self._open[rank] = reader
        self._tails[rank] = bytearray()
        self._received[rank] = 0

    def waitables(self) -> list[Connection]:
        return list(self._open.values())

    def pump(self) -> int:
        """Read what the ranks have written so far; return the number of bytes."""
        count = 0
        for rank, reader in list(self._open.items()):
            for _ in range(16):  # a rank that never stops writing cannot stall us
                try:
                    data = os.read(reader.fileno(), 65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # the rank, and all it started, closed their stderr
                    reader.close()
                    del self._open[rank]
                    break
                count += len(data)
                self._received[rank] += len(data)
                tail = self._tails[rank]
                tail += data
                del tail[:-_STDERR_TAIL_BYTES]
                if self.forward:
                    _write_to_stderr(data)
        return count

    def received(self, rank: int) -> int:
        return self._received.get(rank, 0)

    def text(self, rank: int, since: int = 0) -> str:
        """What the rank wrote after its first ``since`` bytes, as far as kept."""
        new = self.received(rank) - since
        if new <= 0:
            return ""
        return bytes(self._tails[rank][-new:]).decode("utf-8", "replace")

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()
        self._open.clear()


def _write_to_stderr(data: bytes) -> None:
    """Write ``data`` to file descriptor 2, where the ranks' stderr went before."""
    try:
        while data:
            data = data[os.write(2, data) :]
    except OSError:
        pass


# ----------------------------------------------------------------------------------
# From what the parent saw to one error


def _ranks_text(ranks: Iterable[int]) -> str:
    """How a message names ranks: "rank 2", "ranks 0 and 2", "ranks 0, 1 and 3"."""
    numbers_ = [str(rank) for rank in sorted(ranks)]
    if len(numbers_) == 1:
        return f"rank {numbers_[0]}"
    return f"ranks {', '.join(numbers_[:-1])} and {numbers_[-1]}"


def _last_lines(text: str, count: int = _STDERR_LINES_SHOWN) -> list[str]:
    """The last ``count`` lines of ``text`` that say something: no blank lines and
    no C++ stack frames ("frame #3: ...")."""
    lines = [
        line.rstrip()
        for line in text.replace("\r", "\n").splitlines()
        if line.strip()
        and not line.lstrip().startswith(("frame #", "<omitting python frames>"))
    ]
    return [line[:500] for line in lines[-count:]]


class _Failure:
    """What the parent learnt about one failed rank."""

    def __init__(
        self,
        rank: int,
        exitcode: int | None,
        report: dict | None = None,
        started: bool = False,
        unpickle_error: Exception | None = None,
    ):
        self.rank = rank
        self.exitcode = exitcode
        self.report = report  # from _error_report, None if the rank died
        self.started = started  # its worker had started
        self.unpickle_error = unpickle_error  # its result could not be unpickled
        self.stderr = ""  # the end of its stderr, filled in by _failure_error

    @property
    def priority(self) -> int:
        """0: the worker's own exception, 1: died, 2: a peer's communication error."""
        if self.unpickle_error is not None:
            return 0
        if self.report is None:
            return 1
        return 2 if self.report["communication"] else 0

    def describe(self, world_size: int) -> tuple[str, str]:
        """The headline and the traceback text of this failure."""
        who = f"Rank {self.rank} of {world_size}"
        if self.unpickle_error is not None:
            headline = (
                f"{who} returned a value that cannot be unpickled in this process "
                f"({_describe_exception(self.unpickle_error)}). Return tensors, "
                "numbers, strings, lists or dicts, or objects of classes that this "
                "process can import and rebuild."
            )
            tb = "".join(traceback.format_exception(self.unpickle_error))
            return headline, f"{headline}\n\nWhile unpickling it here:\n{tb}"
        if self.report is not None:
            name, message = self.report["name"], self.report["message"]
            if message is None:
                headline = (
                    f"{who} failed with {name}, whose message cannot be shown: "
                    f"str() of it raised {self.report['unprintable']}"
                )
            else:
                headline = f"{who} failed with {name}: {message}"
            return headline, self.report["traceback"]
        code = self.exitcode
        if code is not None and code < 0:
            how = f"was killed by {_signal_name(-code)} without reporting an error"
        elif self.started:
            how = (
                f"exited with code {code} while its worker was running, without "
                "returning or raising: the worker, or something it called, ended "
                f"the process (for example with os._exit({code})). A worker must "
                "return its result or raise an exception"
            )
        else:
            how = (
                f"exited with code {code} before it could report (see its stderr; a "
                "script that calls spawn needs an `if __name__ == '__main__':` guard)"
            )
        headline = f"{who} {how}"
        tb = f"{headline} (no Python traceback: the process died).\n"
        lines = _last_lines(self.stderr)
        if lines:
            quoted = "\n".join(f"    {line}" for line in lines)
            headline += f". Its stderr ends with:\n{quoted}"
            tb += f"Its stderr ends with:\n{self.stderr}"
        return headline, tb


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failure_error(
    failures: list[_Failure],
    silent: set[int],
    returned: set[int],
    world_size: int,
    stderr: _StderrTails,
    waited_long_enough: bool = False,
) -> WorkerError:
    """One WorkerError for the most telling failure; mention the others briefly.

    It timed out if the rank said so (see :func:`_is_timeout`), or if it failed in
    torch.distributed after ``timeout`` seconds while other ranks were still running
    without a word: it was waiting for them. If it failed in torch.distributed after
    a peer's worker had returned normally, the ranks called different collectives.
    """
    for failure in failures:
        failure.stderr = stderr.text(failure.rank)
    first = min(failures, key=lambda f: (f.priority, f.rank))
    timed_out = first.priority == 2 and (
        bool(first.report["timed_out"]) or (bool(silent) and waited_long_enough)
    )
    headline, tb = first.describe(world_size)
    message = headline
    peers_returned = returned - {first.rank}
    if first.priority == 2 and peers_returned:
        message = (
            f"Rank {first.rank} of {world_size} was still in a collective when "
            f"{_ranks_text(peers_returned)} returned normally from the worker: the "
            "ranks called different collectives (a collective mismatch). Every rank "
            "must call the same collectives in the same order; look for one that "
            "only some ranks reach (a branch on the rank, an early return, a loop "
            "whose length differs). torch.distributed's own error is in "
            "error.traceback"
        )
    elif first.priority == 2 and silent:
        message += (
            f". Rank(s) {sorted(silent)} had not reported: a rank that never joins "
            "a collective makes the others time out"
        )
    error = WorkerError(
        message,
        first.rank,
        first.exitcode,
        tb,
        timed_out,
        missing_ranks=silent,
        returned_ranks=returned,
        stderr=first.stderr,
    )
    # Everything seen, for the curious; left out of the message to keep it stable.
    error.failures = [failure.describe(world_size)[0] for failure in failures]
    error.__cause__ = _RemoteTraceback(tb)
    return error


def _deadline_error(
    processes: list,
    running: set[int],
    returned: set[int],
    stderr: _StderrTails,
    deadline: float,
) -> DeadlineExceededError:
    """The error for ranks still running at the deadline, with the Python stack of
    the first of them: asked for with SIGUSR1 (see _run_rank), read from its
    stderr. The caller's ``finally`` then stops them."""
    first = min(running)
    stderr.forward = False  # the stacks are for the error, not for the screen
    stderr.pump()
    before = stderr.received(first)
    stack = ""
    if hasattr(signal, "SIGUSR1"):
        for rank in running:
            try:
                os.kill(processes[rank].pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass
        give_up = time.monotonic() + _STACK_WAIT_S
        quiet_since = None
        while time.monotonic() < give_up:
            wait(stderr.waitables(), timeout=0.05)
            if stderr.pump():
                quiet_since = time.monotonic()
            elif quiet_since is not None and time.monotonic() - quiet_since > 0.1:
                break  # the dump has arrived, and nothing more comes
        stack = stderr.text(first, since=before)
    world_size = len(processes)
    message = (
        f"The launch did not finish within its deadline of {deadline:g} s: "
        f"{_ranks_text(running)} of {world_size} still running"
    )
    if returned:
        message += f" ({_ranks_text(returned)} had returned)"
    message += (
        ". Every rank has been stopped. A rank stuck outside any collective (an "
        "endless loop, a blocking read) is caught by the deadline, not by the "
        "timeout: "
        f"error.traceback shows where rank {first} was. If the work just needs "
        "longer, pass a larger deadline= (None for no deadline)."
    )
    if stack.strip():
        tb = f"Rank {first} at the deadline (stack dumped by faulthandler):\n{stack}"
    else:
        tb = f"Rank {first} was still running at the deadline (no stack available).\n"
    error = DeadlineExceededError(
        message,
        first,
        tb,
        deadline,
        missing_ranks=running,
        returned_ranks=returned,
        stderr=stderr.text(first),
    )
    error.__cause__ = _RemoteTraceback(tb)
    return error


# ----------------------------------------------------------------------------------
# torchrun


def run_torchrun(
    module: str,
    nproc_per_node: int,
    *args: Any,
    timeout: float = 120.0,
    threads: int = 1,
    check: bool = True,
    master_port: int | None = None,
    options: Sequence[str] = (),
    rendezvous: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``torchrun --standalone --nproc-per-node=N -m module args`` as a
    subprocess; return its stdout and stderr as text (09-11).

    ``master_port=P`` replaces ``--standalone`` (a free port) with the fixed
    ``--master-addr=127.0.0.1 --master-port=P`` of the common walk-throughs, which
    fails when another program holds P (09b shows it). ``options`` go to torchrun
    (``["--max-restarts=3"]``), ``rendezvous`` replaces ``--standalone`` with other
    rendezvous options, and ``env`` adds environment variables (11).
    """
    _check_arguments(nproc_per_node, timeout, threads)
    process = start_torchrun(
        module,
        nproc_per_node,
        *args,
        threads=threads,
        master_port=master_port,
        options=options,
        rendezvous=rendezvous,
        env=env,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_torchrun(process)
        stdout, stderr = process.communicate()
        raise TorchrunError(
            f"torchrun -m {module} did not finish within {timeout} s and was "
            "stopped. Raise timeout=, or look for a rank that never joins.",
            stdout + stderr,
        ) from None
    finally:
        stop_torchrun(process)  # workers that outlived torchrun
    result = subprocess.CompletedProcess(
        process.args, process.returncode, stdout, stderr
    )
    if check and result.returncode != 0:
        tail = "\n".join((stdout + stderr).strip().splitlines()[-20:])
        raise TorchrunError(
            f"torchrun -m {module} exited with code {result.returncode}; its output "
            f"ends with:\n{tail}",
            stdout + stderr,
        )
    return result


def start_torchrun(
    module: str,
    nproc_per_node: int,
    *args: Any,
    threads: int = 1,
    master_port: int | None = None,
    options: Sequence[str] = (),
    rendezvous: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    output: Any = subprocess.PIPE,
) -> subprocess.Popen:
    """Start torchrun as :func:`run_torchrun` does, without waiting for it (11).

    It leads a new session, so :func:`stop_torchrun` can end it with everything it
    started. ``output``: where its stdout and stderr go (``subprocess.PIPE``, the
    default, or an open file, which takes both). Stop it with :func:`stop_torchrun`
    in a ``finally``.
    """
    _check_arguments(nproc_per_node, None, threads)
    if rendezvous is not None:
        rendezvous = [str(option) for option in rendezvous]
    elif master_port is None:
        rendezvous = ["--standalone"]
    else:
        rendezvous = ["--master-addr=127.0.0.1", f"--master-port={master_port}"]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        *map(str, options),
        f"--nproc-per-node={nproc_per_node}",
        "-m",
        module,
        *map(str, args),
    ]
    environment = _laptop_environment(os.environ, sys.platform, torchrun=True)
    environment.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    environment.update(env or {})
    to_file = output is not subprocess.PIPE
    return subprocess.Popen(
        command,
        stdout=output,
        stderr=subprocess.STDOUT if to_file else subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,  # torchrun leads its own process group
    )


def stop_torchrun(process: subprocess.Popen, grace: float = 10.0) -> None:
    """End a torchrun and every worker it started, and reap it (11).

    torchrun starts each worker in a session of its own, so killing torchrun's
    process group does not reach them, and a SIGKILLed torchrun leaves them
    running. So torchrun first gets SIGTERM, on which it stops its workers (SIGTERM,
    then SIGKILL) and exits; only if it is still running after ``grace`` seconds is
    its group killed.
    """
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    _kill_group(process.pid)
    if process.poll() is None:
        process.kill()
        process.wait()


def _kill_group(pid: int) -> None:
    if hasattr(os, "killpg"):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_rank(code: int = 0) -> NoReturn:
    """End a torchrun rank with exit status ``code`` without Python's shutdown (09).

    Call it last, after ``dist.destroy_process_group()``. A script that simply
    returns can die of SIGABRT *after* its work is done ("terminate called without
    an active exception"; ``bench/exit_abort.py`` counts how often). The chain:
    building a ``DistributedDataParallel`` leaves references to the gloo process
    group that ``destroy_process_group()`` does not remove, so the group and its
    worker threads live on; a worker drops its reference to a collective's tensors
    only after the collective has returned, and for a tensor Python also holds
    that takes the GIL; if the main thread has begun shutting the interpreter down
    by then, Python ends the worker thread where it waits for the GIL, the C++
    runtime aborts the process, and torchrun reports a failed rank (and, with
    ``--max-restarts``, starts the whole job again). ``os._exit`` skips the
    interpreter's shutdown, as ``multiprocessing`` does for the ranks of
    :func:`spawn`; stdout and stderr are flushed first, so no output is lost.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def in_one_launch(
    rank: int, world_size: int, calls: list[tuple[Callable[..., Any], tuple]]
) -> list[Any]:
    """Run several workers one after the other on the same ranks and return their
    results in order: starting processes costs more than this model's training
    (09, 09b)."""
    return [worker(rank, world_size, *args) for worker, args in calls]
