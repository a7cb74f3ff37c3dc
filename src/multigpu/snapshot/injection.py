"""An injected fault: a rank that kills itself with SIGKILL after a step, once
(11)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from multigpu.snapshot.events import record_event


@dataclass(frozen=True)
class Fault:
    """Rank ``rank`` kills itself with SIGKILL after step ``step`` (counted from 1:
    once it has done ``step`` steps, before the next); once (11)."""

    rank: int
    step: int

    def marker(self, folder: str | os.PathLike) -> Path:
        """The file that says this fault has fired: it is in the snapshot folder,
        so a restarted rank finds it and does not fire again."""
        return Path(folder) / f"fault_rank{self.rank}_step{self.step}.fired"


def fire(fault: Fault | None, folder: str | os.PathLike, rank: int, step: int) -> None:
    """If ``fault`` is due on this rank after ``step`` steps done and has not fired
    before: note it in the folder, then SIGKILL this process (no clean-up, no
    message, as when a machine dies or the out-of-memory killer strikes) (11)."""
    if fault is None or fault.rank != rank or fault.step != step:
        return
    marker = fault.marker(folder)
    if marker.exists():
        return
    marker.write_text(f"rank {rank} killed itself after step {step}\n")
    record_event(folder, "kill", rank=rank, step=step)
    print(f"rank {rank}: SIGKILL to itself after step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
