"""Tests for multigpu.runtime.launch.torchrun: run_torchrun, exit_rank, and the
torchrun example multigpu.ranks.torchrun_example."""

import subprocess
import sys

import pytest

from multigpu.ranks import torchrun_example
from multigpu.runtime.launch import (
    TorchrunError,
    run_torchrun,
)
from tests.runtime.launch.processes import descendants


def test_run_torchrun_returns_the_output_of_the_ranks(no_leftovers):
    result = run_torchrun("multigpu.ranks.torchrun_example", 2, timeout=120.0)
    assert result.returncode == 0
    assert "world_size=2 sum=3 threads=1" in result.stdout


needs_proc = pytest.mark.skipif(
    torchrun_example.native_threads() is None, reason="counts threads via /proc"
)


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@needs_proc
def test_ddp_keeps_the_gloo_threads_after_destroy_process_group(no_leftovers):
    # The first link in exit_rank's chain of causes: once DDP was built, the
    # group's worker threads outlive destroy_process_group (and a garbage
    # collection). If a PyTorch release changes that, exit_rank's docstring and
    # notebook 09's explanation need another look.
    result = run_torchrun(
        "multigpu.ranks.torchrun_example", 2, "ddp-exit", timeout=120.0
    )
    line = next(x for x in result.stdout.splitlines() if "native threads" in x)
    before, during, after = (int(word) for word in line.split() if word.isdigit())
    assert during > before
    assert after == during


@needs_proc
def test_without_ddp_destroy_process_group_ends_the_gloo_threads():
    script = (
        "import torch, torch.distributed as dist\n"
        "from multigpu.ranks.torchrun_example import native_threads as count\n"
        "torch.ones(2).sum(); before = count()\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, "
        "world_size=1)\n"
        "t = torch.ones(2); dist.all_reduce(t); during = count()\n"
        "dist.destroy_process_group(); print(before, during, count())\n"
    )
    done = _run_python(script)
    before, during, after = map(int, done.stdout.split())
    assert during > before
    assert after == before


def test_exit_rank_flushes_the_output_and_keeps_the_exit_status():
    script = (
        "import sys\n"
        "from multigpu.runtime.launch import exit_rank\n"
        "print('to stdout', end='')\n"
        "print('to stderr', end='', file=sys.stderr)\n"
        "exit_rank(3)\n"
    )
    done = _run_python(script)
    assert (done.returncode, done.stdout, done.stderr) == (3, "to stdout", "to stderr")


def test_ranks_ending_with_exit_rank_never_abort(no_leftovers):
    # Without exit_rank, 4 such ranks aborted in 1 launch of 30 and 1 of 40 on a
    # 2-core machine (bench/exit_abort.py): too rare to show in a test. With it, no
    # launch may fail.
    for _ in range(5):
        result = run_torchrun(
            "multigpu.ranks.torchrun_example",
            4,
            "ddp-exit",
            "exit_rank",
            timeout=120.0,
            check=False,
        )
        output = result.stdout + result.stderr
        assert "terminate called" not in output
        assert result.returncode == 0, output[-2000:]
        assert "after destroy_process_group" in result.stdout


def test_run_torchrun_stops_a_run_that_takes_too_long():
    before = descendants()
    with pytest.raises(TorchrunError, match="did not finish within 0.5 s"):
        run_torchrun("multigpu.ranks.torchrun_example", 1, timeout=0.5)
    assert descendants() - before == set()
