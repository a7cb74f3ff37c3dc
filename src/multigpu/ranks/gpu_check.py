"""The rank functions of ``make gpu-check`` (:mod:`multigpu.doctor.gpu_measure`):
all-reduce times and DDP step times, on each rank's GPU under nccl, or on the CPU
under gloo (a dry run where there is no GPU)."""

from __future__ import annotations

import time

import torch

DDP_BATCH = 256  # per GPU, 8x8 digits like notebook 09's
STEPS, WARMUP = 30, 5
CPU = torch.device("cpu")


def rank_device(rank: int) -> torch.device:
    """``cuda:rank`` under nccl; the CPU under gloo (a dry run on a CPU machine)."""
    import torch.distributed as dist

    return torch.device("cuda", rank) if dist.get_backend() == "nccl" else CPU


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued kernels (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_reduce_rank(rank: int, world_size: int, sizes_mib: tuple[int, ...]) -> dict:
    """Seconds per ``dist.all_reduce`` of float32 tensors of ``sizes_mib`` MiB on
    this rank's device (the median of 10 after 3 warm-ups), and the backend."""
    import torch.distributed as dist

    device, seconds = rank_device(rank), {}
    for mib in sizes_mib:
        tensor = torch.ones(mib * 2**18, device=device)
        times = []
        for repeat in range(13):
            synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            synchronize(device)
            if repeat >= 3:
                times.append(time.perf_counter() - start)
        seconds[mib] = sorted(times)[len(times) // 2]
    return {"backend": dist.get_backend(), "seconds": seconds}


def ddp_step_rank(rank: int, world_size: int, steps: int = STEPS) -> dict:
    """Milliseconds per DDP training step of ConvNet on ``DDP_BATCH`` 8x8 images
    per GPU (the median of ``steps`` after ``WARMUP``), and the backend."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from multigpu.core.models import ConvNet

    device = rank_device(rank)
    torch.manual_seed(0)
    ids = [rank] if device.type == "cuda" else None
    model = DistributedDataParallel(ConvNet().to(device), device_ids=ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X = torch.randn(DDP_BATCH, 1, 8, 8, device=device)
    y = torch.randint(0, 10, (DDP_BATCH,), device=device)
    times = []
    for step in range(WARMUP + steps):
        synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(X), y).backward()
        optimizer.step()
        synchronize(device)
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    return {"backend": dist.get_backend(), "ms": 1000 * sorted(times)[len(times) // 2]}
