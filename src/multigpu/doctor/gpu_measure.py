"""The measurements of ``make gpu-check``, each in its own process.

``python -m multigpu.doctor.gpu_measure ITEM`` prints one JSON line: ``probe``
(torch, CUDA, the GPUs; no GPU is not an error), ``allreduce [MiB ...]`` (nccl
all-reduce bandwidth on 2 ranks), ``ddp-step N [STEPS]`` (a DDP step of ConvNet on
N GPUs, in ms; both run on gloo where there are fewer GPUs, a dry run on a CPU),
``dp-memory`` (peak memory per GPU under ``nn.DataParallel``). The checks run them
as children so that the process that starts the ranks never touches CUDA
(docs/gpu.md). The rank functions are in :mod:`multigpu.ranks.gpu_check`.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch

from multigpu.ranks.gpu_check import (
    DDP_BATCH,
    STEPS,
    all_reduce_rank,
    ddp_step_rank,
)

ALL_REDUCE_MIB = (1, 64, 256)


def probe() -> dict:
    """torch's version and CUDA build, the GPUs it sees (name, GiB, compute
    capability) and, where it sees none, torch's own warning (a driver too old)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = []
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "name": properties.name,
                "memory_gib": round(properties.total_memory / 2**30, 1),
                "capability": f"{properties.major}.{properties.minor}",
            }
        )
    nccl = None
    if count and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "arch": torch.cuda.get_arch_list() if count else [],
        "gpus": gpus,
        "nccl": nccl,
        "warning": next((str(w.message).splitlines()[0] for w in caught), None),
    }


def all_reduce(sizes_mib: tuple[int, ...] = ALL_REDUCE_MIB) -> dict:
    """All-reduce on 2 ranks, nccl on GPUs (gloo on CPUs: a dry run): per size,
    algbw = S/t and busbw = algbw * 2(n-1)/n in GB/s (nccl-tests', notebook 12)."""
    from multigpu.runtime.launch import spawn

    world_size = 2
    ranks = spawn(all_reduce_rank, world_size, sizes_mib, backend="auto")
    rows = []
    for mib in sizes_mib:
        slowest = max(rank["seconds"][mib] for rank in ranks)
        algbw = mib * 2**20 / slowest / 1e9
        busbw = algbw * 2 * (world_size - 1) / world_size
        rows.append({"mib": mib, "ms": 1000 * slowest, "algbw": algbw, "busbw": busbw})
    return {"backend": ranks[0]["backend"], "rows": rows}


def ddp_step(world_size: int, steps: int = STEPS) -> dict:
    """DDP step time on ``world_size`` GPUs (nccl: "auto" with a GPU per rank;
    gloo on CPUs), the slowest rank's median."""
    from multigpu.runtime.launch import spawn

    ranks = spawn(ddp_step_rank, world_size, steps, backend="auto")
    slowest = max(rank["ms"] for rank in ranks)
    return {"backend": ranks[0]["backend"], "ms": slowest, "batch_per_gpu": DDP_BATCH}


def dp_memory() -> dict:
    """Peak memory (MiB) on each GPU for one ConvNet training step under
    ``nn.DataParallel`` over every GPU, and on one GPU alone (03, 06)."""
    from multigpu.core.models import ConvNet

    count = torch.cuda.device_count()
    X, y = torch.randn(4096, 1, 8, 8), torch.randint(0, 10, (4096,))

    def peaks(model: torch.nn.Module) -> list[float]:
        for index in range(count):
            torch.cuda.reset_peak_memory_stats(index)
        loss = torch.nn.functional.cross_entropy(model(X.cuda(0)), y.cuda(0))
        loss.backward()
        torch.cuda.synchronize()
        return [torch.cuda.max_memory_allocated(i) / 2**20 for i in range(count)]

    torch.manual_seed(0)
    one = peaks(ConvNet().cuda(0))
    torch.cuda.empty_cache()
    parallel = peaks(torch.nn.DataParallel(ConvNet().cuda(0)))
    return {"one_gpu_mib": one[0], "per_gpu_mib": parallel, "batch": len(X)}


def main(argv: list[str]) -> int:
    """Run the measurement ``argv`` names; print its JSON line."""
    item, *rest = argv
    if item == "probe":
        result = probe()
    elif item == "allreduce":
        result = all_reduce(tuple(map(int, rest)) or ALL_REDUCE_MIB)
    elif item == "ddp-step":
        result = ddp_step(int(rest[0]), *map(int, rest[1:]))
    elif item == "dp-memory":
        result = dp_memory()
    else:
        print(f"unknown measurement {item!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
