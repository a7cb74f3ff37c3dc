"""CUDA GPUs and NCCL, when present, and the notebook cells they change."""

from __future__ import annotations

from multigpu.doctor.imports import not_importable
from multigpu.doctor.result import CheckResult, ok

# The code cells that do something only with GPUs: (notebook, cells, GPUs needed).
# Each starts with `if cuda_device_count() < 2:` and otherwise prints one line
# (tests/doctor/test_gpus.py checks this table against the notebooks).
GPU_CELLS = (
    ("02_dataparallel_under_the_hood", 2, 2),
    ("04_pitfall_uneven_last_batch", 1, 2),
    ("05_pitfall_loss_averaging", 1, 2),
    ("06_dataparallel_checkpoints_and_speed", 1, 2),
)
LAUNCH_RANKS = 4  # the most ranks a launch of 07-16 starts


def gpu_cells_text(gpus: int) -> str:
    """Which GPU-only cells run with ``gpus`` GPUs, and which print that they skip."""
    running = [(nb[:2], cells) for nb, cells, need in GPU_CELLS if gpus >= need]
    skipped = [(nb[:2], cells) for nb, cells, need in GPU_CELLS if gpus < need]
    most = max((need for _, _, need in GPU_CELLS if gpus < need), default=0)
    parts = []
    if running:
        count = sum(cells for _, cells in running)
        names = ", ".join(number for number, _ in running)
        parts.append(f"the {count} GPU-only cells of {names} will run")
    if skipped:
        count = sum(cells for _, cells in skipped)
        names = ", ".join(number for number, _ in skipped)
        parts.append(
            f"the {count} cells of {names} that need {most} GPUs print one line "
            "and skip"
        )
    return "; ".join(parts)


def check_gpus() -> CheckResult:
    """CUDA GPUs (count, names) and NCCL, and what they mean for the notebooks."""
    broken = not_importable("GPUs", "torch")
    if broken is not None:
        return broken
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        return ok("GPUs", f"no CUDA GPU (none needed): {gpu_cells_text(0)}")
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    nccl = dist.is_available() and dist.is_nccl_available()
    found = f"{gpus} CUDA GPU{'s' if gpus > 1 else ''} ({names})"
    if not nccl or gpus < LAUNCH_RANKS:
        why = "nccl not available" if not nccl else f"fewer than {LAUNCH_RANKS}"
        return ok(
            "GPUs",
            f"{found}, {why}: {gpu_cells_text(gpus)}; the launches of 07-16 that "
            "have more ranks than GPUs run on gloo, every rank on the CPU",
        )
    return ok(
        "GPUs",
        f"{found}, nccl available: {gpu_cells_text(gpus)}; the launches of 07-16 "
        "use nccl, one GPU per rank",
    )
