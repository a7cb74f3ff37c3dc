"""Published times of DDP, DataParallel and Horovod runs, and what the model
predicts for them (12).

:data:`PUBLISHED` is built from plain data: one row per published time (the
setting, the time, what the model leaves out where it misses), the sources' URLs
and the workloads. A source that gives no single-device time has one row marked
``"calibrates": True``: that row fixes its workload's compute time
(:func:`~multigpu.costmodel.step.calibrate_compute`) and the model predicts the
rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from multigpu.core.reproducibility import round_sig
from multigpu.costmodel.hardware import LINKS, Link
from multigpu.costmodel.step import (
    Workload,
    calibrate_compute,
    dataparallel_step,
    ddp_step,
)


@dataclass(frozen=True)
class Published:
    """A published time and the setting it was measured in: ``seconds`` for
    ``steps`` steps of ``method`` on ``world_size`` devices joined by ``link``;
    ``compute_from`` says where the workload's compute time comes from, ``note``
    what the model leaves out where it misses (12)."""

    source: str
    url: str
    hardware: str
    workload: Workload
    method: str
    world_size: int
    link: Link
    seconds: float
    steps: float = 1.0
    buckets: int = 1
    compute_from: str = ""
    note: str = ""
    calibrates: bool = False  # this row fixed the compute time: it cannot miss


# Steps in one epoch of ImageNet (1,281,167 images) at a global batch of 4 x 800.
_IMAGENET_STEPS = 1_281_167 / 3200

# Per source: the URL, and where its workloads' compute time comes from.
_SOURCES: dict[str, tuple[str, str]] = {
    "PyTorch DDP benchmark": (
        "https://github.com/pytorch/pytorch/blob/main/benchmarks/distributed/ddp/README.md",
        "the 1-GPU run without DDP, 0.097 s/iter",
    ),
    "Hugging Face docs": (
        "https://huggingface.co/docs/transformers/perf_train_gpu_many",
        "calibrated on the DDP run with NVLink",
    ),
    "tczhangzhi": (
        "https://github.com/tczhangzhi/pytorch-distributed",
        "calibrated on the DDP run; times per epoch read from a bar "
        "chart; model and batch are the scripts' defaults (the README states neither)",
    ),
    "WZMIAOMIAO": (
        "https://github.com/WZMIAOMIAO/deep-learning-for-image-processing/"
        "tree/master/pytorch_classification/train_multi_GPU",
        "the 1-GPU epoch, 9 s for 184 steps of 16 images",
    ),
}

# The workloads, by the name the rows give. GPT-2's and ResNet-18's compute times
# are placeholders: the row of their source marked "calibrates" replaces them.
_WORKLOADS: dict[str, Workload] = {
    "ResNet-50": Workload("ResNet-50, batch 32, fp32", 25_557_032, 0.097, 32),
    "GPT-2": Workload(
        "GPT-2 (124 M), batch 4 x 1024 tokens, fp32", 124_439_808, 0.5, 4
    ),
    "ResNet-18": Workload(
        "ResNet-18, batch 800 per GPU, ImageNet", 11_689_512, 1.0, 800
    ),
    "ResNet-34": Workload("ResNet-34 (5 classes), batch 16", 21_287_237, 9.0 / 184, 16),
}

# One row per published time: the fields of Published, with the workload and the
# link by name; "bytes_per_gradient" changes the workload's for that row only.
_ROWS: tuple[dict[str, Any], ...] = (
    {
        "source": "PyTorch DDP benchmark",
        "hardware": "8 x V100 (DGX-1, NVLink)",
        "workload": "ResNet-50",
        "method": "DDP",
        "world_size": 8,
        "link": "NVLink 2 (V100)",
        "seconds": 0.104,
        "buckets": 5,  # 102 MB of gradients in 25 MB buckets
        "note": "DDP's own cost (hooks, copies into buckets) is not modelled: "
        "1 GPU with DDP already takes 0.100 s",
    },
    {
        "source": "PyTorch DDP benchmark",
        "hardware": "2 x 8 V100, 4 x 100 Gb/s InfiniBand per machine",
        "workload": "ResNet-50",
        "method": "DDP",
        "world_size": 16,
        "link": "4 x InfiniBand EDR (DGX-1)",
        "seconds": 0.104,
        "buckets": 5,
        "note": "DDP's own cost (hooks, copies into buckets) is not modelled: "
        "1 GPU with DDP already takes 0.100 s",
    },
    {
        "source": "Hugging Face docs",
        "hardware": "2 x TITAN RTX 24 GB",
        "workload": "GPT-2",
        "method": "DDP",
        "world_size": 2,
        "link": "NVLink bridge (TITAN RTX)",
        "seconds": 101.9003,
        "steps": 200,
        "buckets": 20,  # 498 MB in 25 MB buckets
        "calibrates": True,
    },
    {
        "source": "Hugging Face docs",
        "hardware": "2 x TITAN RTX 24 GB",
        "workload": "GPT-2",
        "method": "DataParallel",
        "world_size": 2,
        "link": "NVLink bridge (TITAN RTX)",
        "seconds": 110.5948,
        "steps": 200,
        "buckets": 20,
        "note": "DataParallel's interpreter lock is not modelled (host = 0 here)",
    },
    {
        "source": "Hugging Face docs",
        "hardware": "2 x TITAN RTX, NCCL_P2P_DISABLE=1",
        "workload": "GPT-2",
        "method": "DDP",
        "world_size": 2,
        "link": "PCIe 3.0 x16",
        "seconds": 131.4367,
        "steps": 200,
        "buckets": 20,
        "note": "with peer-to-peer disabled, NCCL copies through host memory, "
        "far below the PCIe peak the model assumes",
    },
    {
        "source": "tczhangzhi",
        "hardware": "4 x Tesla V100-PCIe",
        "workload": "ResNet-18",
        "method": "DDP",
        "world_size": 4,
        "link": "PCIe 3.0 x16",
        "seconds": 1188.5,
        "steps": _IMAGENET_STEPS,
        "buckets": 2,
        "calibrates": True,
    },
    {
        "source": "tczhangzhi",
        "hardware": "4 x Tesla V100-PCIe",
        "workload": "ResNet-18",
        "method": "DataParallel",
        "world_size": 4,
        "link": "PCIe 3.0 x16",
        "seconds": 4138.3,
        "steps": _IMAGENET_STEPS,
        "buckets": 2,
        "note": "one process decodes ImageNet's JPEGs for all 4 GPUs (4 loader "
        "workers instead of DDP's 4 per GPU) and runs every replica's Python "
        "under one interpreter lock: the input pipeline, not the links, is "
        "the limit, and the model has no input pipeline",
    },
    {
        "source": "tczhangzhi",
        "hardware": "4 x Tesla V100-PCIe",
        "workload": "ResNet-18",
        "bytes_per_gradient": 2,
        "method": "Horovod",
        "world_size": 4,
        "link": "PCIe 3.0 x16",
        "seconds": 1200.3,
        "steps": _IMAGENET_STEPS,
        "buckets": 2,
        "note": "Horovod with fp16 gradient compression, modelled as DDP's ring "
        "all-reduce of 2-byte gradients",
    },
    # An epoch of 2936 images in batches of 16 per GPU: ceil(2936 / (16 n)) steps.
    {
        "source": "WZMIAOMIAO",
        "hardware": "GPUs not stated (PCIe 3.0 assumed)",
        "workload": "ResNet-34",
        "method": "DDP",
        "world_size": 2,
        "link": "PCIe 3.0 x16",
        "seconds": 5.5,
        "steps": 92,
        "buckets": 4,
    },
    {
        "source": "WZMIAOMIAO",
        "hardware": "GPUs not stated (PCIe 3.0 assumed)",
        "workload": "ResNet-34",
        "method": "DDP",
        "world_size": 4,
        "link": "PCIe 3.0 x16",
        "seconds": 3.0,
        "steps": 46,
        "buckets": 4,
    },
    {
        "source": "WZMIAOMIAO",
        "hardware": "GPUs not stated (PCIe 3.0 assumed)",
        "workload": "ResNet-34",
        "method": "DDP",
        "world_size": 8,
        "link": "PCIe 3.0 x16",
        "seconds": 2.0,
        "steps": 23,
        "buckets": 4,
        "note": "fixed costs per epoch (loader start, validation) do not "
        "shrink with more GPUs; at 8 GPUs an epoch is only 23 steps",
    },
)


def _calibrated_workloads() -> dict[str, Workload]:
    """The workloads, with the compute time of each fixed by its source's row
    marked ``calibrates``: the time for which DDP's predicted step takes that
    row's seconds per step."""
    workloads = dict(_WORKLOADS)
    for row in _ROWS:
        if row.get("calibrates"):
            workloads[row["workload"]] = calibrate_compute(
                workloads[row["workload"]],
                row["world_size"],
                LINKS[row["link"]],
                row["buckets"],
                row["seconds"] / row["steps"],
            )
    return workloads


def _published_rows() -> list[Published]:
    """:data:`_ROWS` as :class:`Published`, their names replaced by the workloads,
    links, URLs and compute sources they stand for."""
    workloads = _calibrated_workloads()
    published = []
    for row in _ROWS:
        fields = dict(row)
        workload = workloads[fields.pop("workload")]
        if "bytes_per_gradient" in fields:
            workload = replace(
                workload, bytes_per_gradient=fields.pop("bytes_per_gradient")
            )
        url, compute_from = _SOURCES[fields["source"]]
        fields.update(
            url=url,
            workload=workload,
            link=LINKS[fields["link"]],
            compute_from=compute_from,
        )
        published.append(Published(**fields))
    return published


PUBLISHED: list[Published] = _published_rows()


def predict(row: Published) -> float:
    """The model's time for a published row, in the row's unit (12)."""
    if row.method in ("DDP", "Horovod"):  # both: ring all-reduces during backward
        step = ddp_step(row.workload, row.world_size, row.link, row.buckets)
    else:
        step = dataparallel_step(row.workload, row.world_size, row.link)
    return row.steps * step.total


def published_table(rows: Iterable[Published] = PUBLISHED) -> list[dict]:
    """One dict per published row: what was run, the published and the predicted
    time, the miss (predicted / published - 1) and what the model leaves out
    (12)."""
    table = []
    for row in rows:
        predicted = predict(row)
        miss = predicted / row.seconds - 1
        table.append(
            {
                "source": row.source,
                "hardware": row.hardware,
                "model": row.workload.name,
                "method": row.method,
                "GPUs": row.world_size,
                "published s": row.seconds,
                "predicted s": round_sig(predicted, 3),
                "miss": "calibrated" if row.calibrates else f"{miss:+.0%}",
                "left out of the model": row.note,
            }
        )
    return table
