"""Do the ranks end when the process that called spawn is killed? And how fast?

    python bench/orphans.py                 # a script, then a kernel: SIGKILL, SIGTERM
    python bench/orphans.py --repeats 3

A caller (a script, or a real Jupyter kernel) calls ``launch.spawn`` on
``record_pid_and_spin_rank`` (``bench/ranks.py``): each rank writes its pid to a file,
then spins at full CPU forever, outside any collective, with no deadline. Once every
rank has started, the caller is killed by a signal that gives it no chance to clean up
(SIGKILL; SIGTERM, which Python does not handle by default). Two more rows kill a
script by SIGKILL while no Python can run in a rank: its ranks sit in one long C call
that holds the GIL (``hold_the_gil_rank``), or rank 0 is stopped (SIGSTOP). The
table gives the seconds
from the kill to the exit of the last rank, and to the exit of the last process the
caller had started (ranks, forkserver, resource tracker), and how many were left after
the wait: that must be 0 (see docs/launch.md, "If the caller itself dies"). Anything
left is killed here, so a failed run leaves nothing.

``tests/runtime/launch/test_child.py`` runs the same measurements (from this file)
with limits.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

import psutil

STARTUP_S = 90.0  # the longest a caller may take to start its ranks
WAIT_S = 20.0  # how long to wait for the processes to end after the kill

ROOT = Path(__file__).resolve().parents[1]  # the repository, home of bench.ranks
SCRIPT = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})  # the ranks inherit it: they import bench.ranks

from bench.ranks import hold_the_gil_rank
from bench.ranks import record_pid_and_spin_rank
from multigpu.runtime import launch

if __name__ == "__main__":
    pid_dir, world_size, rank = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    worker = hold_the_gil_rank if rank == "gil" else record_pid_and_spin_rank
    launch.spawn(worker, world_size, pid_dir, deadline=None)
"""
# What the ranks do when the caller is killed: kill_a_script's ``ranks``.
SPINNING, HOLDING_THE_GIL, STOPPED = "spinning", "holding the GIL", "rank 0 stopped"


@dataclass
class Orphans:
    """What happened after the caller was killed."""

    caller: str  # what was killed, and how
    ranks: list[int]
    helpers: list[int]  # the other processes the caller had started
    ranks_gone_s: float | None = None  # kill -> last rank gone (None: not gone)
    all_gone_s: float | None = None  # kill -> last of ranks and helpers gone
    left: list[int] = field(default_factory=list)  # still running after WAIT_S


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie has exited: only its entry is left)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _descendants(pid: int) -> set[int]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {child.pid for child in children if not _gone(child.pid)}


def _wait_for_pids(pid_dir: Path, world_size: int, failed) -> list[int]:
    """The ranks' pids, once every rank has written its file; ``failed()`` returns
    an error text when the caller gave up."""
    give_up = time.monotonic() + STARTUP_S
    while time.monotonic() < give_up:
        files = sorted(pid_dir.glob("rank*.pid"))
        if len(files) == world_size:
            return [int(path.read_text()) for path in files]
        problem = failed()
        if problem:
            raise RuntimeError(
                f"the caller failed before its ranks started:\n{problem}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"the ranks did not start within {STARTUP_S} s")


def _kill_and_watch(
    caller_pid: int, how: signal.Signals, ranks: list[int], label: str
) -> Orphans:
    """Kill the caller with ``how``; time how long its ranks and helpers live on."""
    helpers = sorted(_descendants(caller_pid) - set(ranks))
    result = Orphans(label, ranks, helpers)
    alive = set(ranks) | set(helpers)
    killed_at = time.monotonic()
    os.kill(caller_pid, how)
    while alive and time.monotonic() - killed_at < WAIT_S:
        alive = {pid for pid in alive if not _gone(pid)}
        now = time.monotonic() - killed_at
        if result.ranks_gone_s is None and not alive & set(ranks):
            result.ranks_gone_s = now
        if not alive:
            result.all_gone_s = now
            break
        time.sleep(0.005)
    result.left = sorted(alive)
    for pid in alive:  # never leave a process behind, even when the check fails
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return result


def kill_a_script(
    how: signal.Signals, workdir: Path, world_size: int = 2, ranks: str = SPINNING
) -> Orphans:
    """A script calls spawn; kill the script with ``how`` once the ranks run.

    ``ranks``: what they do then: SPINNING (a Python loop), HOLDING_THE_GIL (one
    endless C call), or STOPPED (they spin and rank 0 got SIGSTOP)."""
    script, pid_dir = workdir / "caller.py", workdir / "pids"
    script.write_text(SCRIPT)
    pid_dir.mkdir()
    kind = "gil" if ranks == HOLDING_THE_GIL else "spin"
    with open(workdir / "caller.log", "w") as log:
        caller = subprocess.Popen(
            [sys.executable, str(script), str(pid_dir), str(world_size), kind],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal signal reaches it by accident
        )
    try:

        def failed() -> str:
            if caller.poll() is None:
                return ""
            return (workdir / "caller.log").read_text()

        pids = _wait_for_pids(pid_dir, world_size, failed)
        label = f"script, {how.name}"
        if ranks == STOPPED:
            os.kill(pids[0], signal.SIGSTOP)
        if ranks != SPINNING:
            label += f", {ranks}"
        result = _kill_and_watch(caller.pid, how, pids, label)
    finally:
        if caller.poll() is None:
            caller.kill()
        caller.wait()
    return result


def kill_a_kernel(
    workdir: Path, world_size: int = 2, how: signal.Signals = signal.SIGKILL
) -> Orphans:
    """A Jupyter kernel (ipykernel on this Python, as JupyterLab starts it) calls
    spawn; kill the kernel with ``how`` once the ranks run (SIGKILL, as the
    out-of-memory killer does; SIGTERM, as ``kill PID`` does)."""
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelSpecManager):
        """The kernel runs on this interpreter, whatever kernels are installed."""

        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    pid_dir = workdir / "pids"
    pid_dir.mkdir()
    manager = KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())
    manager.start_kernel(cwd=str(workdir))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=STARTUP_S)
        kernel_pid = manager.provisioner.pid
        client.execute(
            f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            "from bench.ranks import record_pid_and_spin_rank\n"
            "from multigpu.runtime import launch\n"
            f"launch.spawn(record_pid_and_spin_rank, {world_size}, "
            f"{str(pid_dir)!r}, deadline=None)"
        )

        def failed() -> str:
            while True:
                try:
                    message = client.get_iopub_msg(timeout=0)
                except Exception:  # queue.Empty: nothing new
                    return ""
                if message["msg_type"] == "error":
                    return "\n".join(message["content"]["traceback"])

        ranks = _wait_for_pids(pid_dir, world_size, failed)
        return _kill_and_watch(kernel_pid, how, ranks, f"Jupyter kernel, {how.name}")
    finally:
        client.stop_channels()
        try:
            manager.shutdown_kernel(now=True)
        except Exception:  # it is already dead: that was the point
            pass
        manager.cleanup_resources()


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=2)
    options = parser.parse_args()
    python = sys.version.split()[0]
    print(f"{platform.node()}, {os.cpu_count()} CPU cores, Python {python}")
    header = (
        f"{'caller killed':<42} {'ranks':>5} {'last rank gone s':>17} "
        f"{'all gone s':>11} {'left':>5}"
    )
    print(header)
    print("-" * len(header))
    runs = [lambda d: kill_a_script(signal.SIGKILL, d, options.world_size)]
    runs.append(lambda d: kill_a_script(signal.SIGTERM, d, options.world_size))
    runs.append(lambda d: kill_a_kernel(d, options.world_size, signal.SIGKILL))
    runs.append(lambda d: kill_a_kernel(d, options.world_size, signal.SIGTERM))
    for ranks in (HOLDING_THE_GIL, STOPPED):
        runs.append(
            lambda d, r=ranks: kill_a_script(signal.SIGKILL, d, options.world_size, r)
        )
    for run in runs * options.repeats:
        with TemporaryDirectory() as workdir:
            result = run(Path(workdir))
        print(
            f"{result.caller:<42} {len(result.ranks):>5} "
            f"{_seconds(result.ranks_gone_s):>17} {_seconds(result.all_gone_s):>11} "
            f"{len(result.left):>5}",
            flush=True,
        )
        if result.left:
            sys.exit(f"processes left after the caller died: {result.left}")


if __name__ == "__main__":
    main()
