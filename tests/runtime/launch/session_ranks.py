"""Rank functions of the tests of launch that start processes in sessions of their
own (``start_new_session=True``), which the rank's process group does not hold."""

import subprocess
import time
from pathlib import Path

import torch.distributed as dist

# A process that lives long after any test, unless something ends it.
SLEEPER = ["sleep", "600"]


def start_session_child_rank(rank: int, world_size: int, folder: str) -> int:
    """Start a sleeper in a session of its own and note its pid in
    ``folder/child.RANK``; then rank 0 returns, rank 1 raises (after a moment, so
    that rank 0 has returned) and every other rank hangs until spawn ends it."""
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    Path(folder, f"child.{rank}").write_text(str(child.pid))
    dist.barrier()  # every child has been started
    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("rank 1 failed after starting a process in a new session")
    if rank >= 2:
        time.sleep(600)
    return child.pid


def start_session_child_and_wait_rank(rank: int, world_size: int, folder: str):
    """Start a sleeper in a session of its own, note its pid in ``folder/child.RANK``
    and this rank's in ``folder/rank.RANK``, then wait until something ends it."""
    child = subprocess.Popen(SLEEPER, start_new_session=True)
    Path(folder, f"child.{rank}.tmp").write_text(str(child.pid))
    Path(folder, f"child.{rank}.tmp").rename(Path(folder, f"child.{rank}"))
    time.sleep(600)
