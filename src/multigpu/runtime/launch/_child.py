"""The child side of spawn: what runs in each rank, and what it reports.

What a rank tells the parent through its pipe, in order: ("started",) just before
the worker runs, ("returned",) once it has returned, then ("ok", pickled result)
or ("error", report) (see _error_report). A rank that dies sends nothing more; the
parent then learns from its exit code, and from its stderr, which goes through the
parent too. The forkserver preloads this module (see parent._context).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from multigpu.runtime.launch._process_tree import end_descendants
from multigpu.runtime.launch.timeouts import (
    as_timedelta,
    is_communication_error,
    is_timeout,
)

HOST = "127.0.0.1"


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
    _end_what_this_rank_started()
    if hasattr(os, "killpg") and os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)  # this rank and every process it started
    os._exit(1)


def _end_what_this_rank_started() -> None:
    """Kill every process below this rank, those in sessions of their own
    (``start_new_session=True``) too, which its process group does not hold. It runs
    before the rank reports its end, and before it leaves on its own, since once it
    has exited they belong to init and cannot be found any more."""
    try:
        end_descendants()
    except Exception:  # never in the way of the report
        pass


def _send(writer: Connection, message: tuple) -> None:
    writer.send_bytes(pickle.dumps(message))


def run_rank(
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
    # Every group a worker makes (new_group, a DeviceMesh's dimensions) is made on
    # every rank before any rank goes on: without this, a rank could return and close
    # its connections while a peer was still accepting one of them, and the peer then
    # failed in a worker that made its groups and returned (distributed_c10d.py reads
    # this variable in init_process_group and new_group).
    os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
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
            HOST, port, is_master=False, timeout=as_timedelta(timeout)
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=as_timedelta(timeout),
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
        _end_what_this_rank_started()
        _send(writer, ("ok", data))
    except BaseException as exc:
        waited_s = time.monotonic() - rendezvous_start
        _end_what_this_rank_started()
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
        unprintable = describe_exception(str_error)
    try:
        communication = is_communication_error(exc)
        timed_out = is_timeout(exc, waited_s, timeout)
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


def describe_exception(exc: BaseException) -> str:
    """``"Name: message"``, or just the name when even that text cannot be made."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__
