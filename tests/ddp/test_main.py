"""The torchrun script: runs under torchrun, says to use it otherwise."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from multigpu import ddp
from multigpu.runtime.launch import run_torchrun


def test_read_rank_env_says_to_use_torchrun():
    env = ddp.read_rank_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert env == ddp.RankEnv(rank=1, local_rank=1, world_size=2)
    with pytest.raises(ddp.NotLaunchedByTorchrunError, match="torchrun --standalone"):
        ddp.read_rank_env({})


def test_plain_python_exits_with_code_2_and_says_to_use_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ddp.ENV_NAMES}
    done = subprocess.run(
        [sys.executable, "-m", "multigpu.ddp", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: RANK, LOCAL_RANK, WORLD_SIZE not set")
    assert ddp.COMMAND in done.stderr


def test_nccl_with_more_local_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ddp.NotEnoughGPUsError) as raised:
        ddp.setup("nccl")
    assert str(raised.value) == (
        "nccl needs one GPU per rank, but this is local rank 1 on a machine with "
        "1 GPU(s) visible. Start at most 1 processes per node (torchrun "
        "--nproc-per-node=1), or pass --backend gloo."
    )
    assert not dist.is_initialized()


def test_torchrun_runs_the_script(tmp_path):
    result = run_torchrun(
        "multigpu.ddp",
        2,
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--lr",
        "0.2",
        "--no-progress",
        "--checkpoint",
        tmp_path / "last.pt",
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "2 ranks (gloo), global batch 256 = 2 x 128, lr 0.2"
    assert lines[1].startswith("epoch 1/1: train loss ")
    assert lines[-1] == "every rank holds the same weights: True"
    assert (tmp_path / "last.pt").exists()
