"""torchrun from Python: run it, start it, stop it, and end one of its ranks (09-11)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from multigpu.runtime.launch._checks import check_arguments
from multigpu.runtime.launch.environment import laptop_environment
from multigpu.runtime.launch.errors import TorchrunError


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
    check_arguments(nproc_per_node, timeout, threads)
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
    check_arguments(nproc_per_node, None, threads)
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
    environment = laptop_environment(os.environ, sys.platform, torchrun=True)
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
