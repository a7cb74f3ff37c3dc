"""CUDA GPUs and NCCL, simulated on a CPU machine, and the GPU-only cells."""

import json
import re

import pytest
import torch
import torch.distributed as dist

from multigpu.doctor.environment import project_root
from multigpu.doctor.gpus import GPU_CELLS, check_gpus
from multigpu.doctor.result import OK
from multigpu.ranks.doctor import all_reduce_check_rank
from multigpu.runtime.launch import spawn


@pytest.fixture
def fake_gpus(monkeypatch):
    """``fake_gpus(n, nccl=True)``: this process sees ``n`` CUDA GPUs."""

    def install(count, nccl=True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
        monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)

    return install


def test_without_gpus_the_cells_that_need_two_say_so(fake_gpus):
    fake_gpus(0)
    result = check_gpus()
    assert result.status == OK
    assert result.measured == (
        "no CUDA GPU (none needed): the 5 cells of 02, 04, 05, 06 that need 2 GPUs "
        "print one line and skip"
    )


def test_four_gpus_with_nccl_run_the_gpu_cells(fake_gpus):
    fake_gpus(4)
    result = check_gpus()
    assert result.status == OK
    assert result.measured == (
        "4 CUDA GPUs (Fake GPU 0, Fake GPU 1, Fake GPU 2, Fake GPU 3), nccl "
        "available: the 5 GPU-only cells of 02, 04, 05, 06 will run; the launches "
        "of 07-16 use nccl, one GPU per rank"
    )


@pytest.mark.parametrize("count", [1, 2])
def test_fewer_gpus_than_ranks_run_those_launches_on_gloo(fake_gpus, count):
    fake_gpus(count)
    result = check_gpus()
    assert result.status == OK
    assert result.measured.endswith(
        "the launches of 07-16 that have more ranks than GPUs run on gloo, every "
        "rank on the CPU"
    )
    assert ", fewer than 4: " in result.measured
    runs = "the 5 GPU-only cells of 02, 04, 05, 06 will run"
    assert (runs in result.measured) == (count >= 2)


def test_gpus_without_nccl_run_the_launches_on_gloo(fake_gpus):
    fake_gpus(2, nccl=False)
    result = check_gpus()
    assert result.status == OK
    assert result.measured == (
        "2 CUDA GPUs (Fake GPU 0, Fake GPU 1), nccl not available: the 5 GPU-only "
        "cells of 02, 04, 05, 06 will run; the launches of 07-16 that have more "
        "ranks than GPUs run on gloo, every rank on the CPU"
    )


def test_what_the_check_says_is_what_spawn_does_with_fewer_gpus(fake_gpus):
    fake_gpus(1)
    ranks = spawn(all_reduce_check_rank, 2)  # nccl would need 2 GPUs: gloo
    assert ranks == spawn(all_reduce_check_rank, 2, backend="gloo")


def test_the_table_of_gpu_only_cells_matches_the_notebooks():
    found = []
    for path in sorted((project_root() / "notebooks").glob("[0-9]*.ipynb")):
        needs = [
            int(match.group(1))
            for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == "code"
            for match in [
                re.search(
                    r"^if cuda_device_count\(\) < (\d+):",
                    "".join(cell["source"]),
                    re.MULTILINE,
                )
            ]
            if match
        ]
        if needs:
            assert len(set(needs)) == 1, path.name
            found.append((path.stem, len(needs), needs[0]))
    assert tuple(found) == GPU_CELLS
