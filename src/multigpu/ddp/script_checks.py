"""Checks of the torchrun script's options that decide from facts outside them:
the folder a path points into, the GPUs of this node (09, 11). Each raises
``ValueError`` or returns the problem in one line; :mod:`multigpu.ddp.cli` turns it
into the script's one-line refusal (exit status 2).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PROBE_BYTES = 64 * 1024  # written and removed to check a folder takes files
# --timeout: under a second the ranks cannot even meet; past a week torch's own
# conversions overflow long before any use (1e14 s is more days than a timedelta
# holds).
TIMEOUT_RANGE_S = (1.0, 7 * 24 * 3600.0)


def check_writable(option: str, value: str, folder: Path) -> None:
    """Raise ``ValueError`` unless a file can be written in ``folder`` (or in the
    nearest folder above it that exists, where the run will create it): a file of
    :data:`PROBE_BYTES` is created, written to disk and removed, so that a
    read-only or full file system is found now, not at the first save (11)."""
    fix = f"Pass a {option} path in a folder you can write to, with space left."
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{option} {value}: {existing} is a file, not a folder. {fix}")
    if option == "--checkpoint" and Path(value).is_dir():
        raise ValueError(f"{option} {value} is a folder; pass a file name. {fix}")
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        reason = (error.strerror or type(error).__name__).lower()
        raise ValueError(
            f"{option} {value}: cannot write a file in {existing} ({reason}). {fix}"
        ) from None


def backend_problem(backend: str, local_world_size: int, gpus: int) -> str | None:
    """Why ``--backend`` cannot run ``local_world_size`` ranks on a node with
    ``gpus`` GPUs, in one line; None if it can. nccl (``auto`` picks it where
    there are GPUs) needs one GPU per rank (09)."""
    if backend == "gloo" or (backend == "auto" and gpus == 0):
        return None
    if gpus == 0:
        return (
            f"--backend {backend} needs a GPU for every rank, and this machine has "
            "no GPU (torch.cuda.device_count() is 0). Pass --backend gloo, or leave "
            "--backend out: auto picks gloo where there is no GPU."
        )
    if local_world_size > gpus:
        chosen = "nccl" if backend == "nccl" else "auto, which picks nccl here,"
        return (
            f"--backend {chosen} needs a GPU for every rank: torchrun started "
            f"{local_world_size} ranks on this node, which has {gpus} GPU(s). Pass "
            f"--nproc-per-node={gpus} or fewer, or --backend gloo."
        )
    return None
