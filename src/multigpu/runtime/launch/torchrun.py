"""torchrun from Python: run it, start it, stop it, and end one of its ranks (09-11)."""

from __future__ import annotations

import contextlib
import locale
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, NoReturn

from multigpu.runtime.launch._checks import check_arguments
from multigpu.runtime.launch._process_tree import descendants, kill_tree
from multigpu.runtime.launch.environment import laptop_environment
from multigpu.runtime.launch.errors import TorchrunError
from multigpu.runtime.launch.timeouts import TORCHRUN_DEADLINE_S, deadline_not_timeout

_POLL_S = 0.5  # run_torchrun: how often it notes the processes torchrun started


@deadline_not_timeout
def run_torchrun(
    module: str,
    nproc_per_node: int,
    *args: Any,
    deadline: float | None = TORCHRUN_DEADLINE_S,
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

    ``deadline`` (seconds; None: no bound) bounds the whole run, ranks included: at
    the deadline torchrun and every process it started are killed (SIGKILL; a
    stopped rank too), and so are ranks that outlive torchrun. Its output goes to
    files, not pipes, so a rank that holds them cannot make this wait. ``timeout=``
    is refused: it means each collective's bound, which the script sets itself
    (``--timeout`` of ``multigpu.ddp``).
    """
    check_arguments(nproc_per_node, threads, deadline=deadline)
    command, environment = _command(
        module, nproc_per_node, args, threads, master_port, options, rendezvous, env
    )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = _popen(command, environment, out, err)
        seen: set = set()  # torchrun's ranks: they leave its tree when it dies
        try:
            finished = _wait(process, deadline, seen)
        finally:
            kill_tree(process, seen)
        stdout, stderr = _read(out), _read(err)
    if not finished:
        raise TorchrunError(
            f"torchrun -m {module} did not finish within {deadline} s and was "
            "stopped. Raise deadline=, or look for a rank that never joins.",
            stdout + stderr,
        )
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
    check_arguments(nproc_per_node, threads)
    command, environment = _command(
        module, nproc_per_node, args, threads, master_port, options, rendezvous, env
    )
    to_file = output is not subprocess.PIPE
    stderr = subprocess.STDOUT if to_file else subprocess.PIPE
    return _popen(command, environment, output, stderr, text=True)


def _command(
    module: str,
    nproc_per_node: int,
    args: Sequence[Any],
    threads: int,
    master_port: int | None,
    options: Sequence[str],
    rendezvous: Sequence[str] | None,
    env: Mapping[str, str] | None,
) -> tuple[list[str], dict[str, str]]:
    """torchrun's command line and environment."""
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
    return command, environment


def _popen(
    command: list[str],
    environment: dict[str, str],
    stdout: Any,
    stderr: Any,
    text: bool = False,
) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdout=stdout,
        stderr=stderr,
        text=text,
        env=environment,
        start_new_session=True,  # torchrun leads its own process group
    )


def _wait(process: subprocess.Popen, deadline: float | None, seen: set) -> bool:
    """Wait for ``process`` to exit (True) or for ``deadline`` seconds (False),
    noting in ``seen`` every process below it meanwhile."""
    end = None if deadline is None else time.monotonic() + deadline
    while True:
        seen |= descendants(process.pid)
        left = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
        if left <= 0:
            return False
        try:
            process.wait(timeout=left)
            return True
        except subprocess.TimeoutExpired:
            pass


def _read(file: IO[bytes]) -> str:
    """What a process wrote to ``file``, decoded as ``text=True`` would."""
    file.seek(0)
    text = file.read().decode(locale.getpreferredencoding(False), errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def stop_torchrun(process: subprocess.Popen, grace: float = 10.0) -> None:
    """End a torchrun and every worker it started, and reap it, within about
    ``grace`` seconds (11).

    torchrun first gets SIGTERM, on which it stops its workers (SIGTERM, which a
    ``--snapshot`` rank handles, then SIGKILL after 30 s) and exits. After
    ``grace`` seconds whatever is left is killed: torchrun, its group, and every
    process below it (SIGKILL: a stopped rank, or one blocked in a collective
    that cannot run its SIGTERM handler, too). torchrun starts each worker in a
    session of its own, so killing its group alone would miss them; they are found
    as its descendants before the SIGTERM. Ranks that outlived a torchrun that had
    already died before this call cannot be found (run_torchrun notes them while
    it runs).
    """
    known = descendants(process.pid) if process.poll() is None else set()
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    kill_tree(process, known)


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
