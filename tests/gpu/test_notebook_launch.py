"""multigpu.runtime.launch.notebook_gpus: the guide's notebook cell (docs/gpu.md)
launches ranks without ever initialising CUDA in the notebook's process, and a
process that has used CUDA is refused in one line before anything starts."""

import json
import subprocess
import sys

import pytest
import torch

from multigpu.doctor.environment import project_root
from multigpu.runtime.launch import notebook_gpus

# Runs in a fresh process: every path by which torch initialises CUDA goes through
# torch.cuda._lazy_init (C++'s device_lazy_init calls it too), so recording its
# calls shows whether the parent ever started CUDA; the last call proves it records.
PARENT = """
import json, sys, torch
calls = []
original = torch.cuda._lazy_init
def recording():
    calls.append(1)
    return original()
torch.cuda._lazy_init = recording
from multigpu.ranks.doctor import all_reduce_check_rank
from multigpu.runtime.launch.notebook_gpus import launch_on_gpus
ranks = launch_on_gpus(all_reduce_check_rank)
import contextlib, io
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    exec(sys.argv[1])  # the guide's cell
before = len(calls)
try:
    torch.zeros(1, device="cuda")
except Exception:
    pass
print(json.dumps({"calls": before, "initialised": torch.cuda.is_initialized(),
                  "ranks": len(ranks), "printed": printed.getvalue(),
                  "control": len(calls) - before}))
"""


def guide_cell() -> str:
    """The ```python block of docs/gpu.md that launches ranks."""
    text = (project_root() / "docs/gpu.md").read_text()
    blocks = text.split("```python\n")[1:]
    cells = [block.split("```")[0] for block in blocks if "torchrun_on_gpus(" in block]
    assert len(cells) == 1
    return cells[0]


def test_the_guides_cell_never_initialises_cuda_in_the_notebooks_process():
    done = subprocess.run(
        [sys.executable, "-c", PARENT, guide_cell()],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["calls"] == 0 and not found["initialised"]
    assert found["control"] == 1  # the recorder sees a CUDA call when there is one
    gpus = torch.cuda.device_count()
    assert found["ranks"] == (gpus or 2)
    assert "epoch 1/1: train loss" in found["printed"]
    assert "every rank holds the same weights: True" in found["printed"]


def test_a_process_that_used_cuda_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    def must_not_start(*args, **kwargs):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(notebook_gpus, "spawn", must_not_start)
    monkeypatch.setattr(notebook_gpus, "run_torchrun", must_not_start)
    message = (
        "CUDA is already initialised in this notebook's process (a cell used a GPU): "
        "restart the kernel and launch the ranks before any cell touches CUDA."
    )
    with pytest.raises(notebook_gpus.CudaInitialisedError) as refused:
        notebook_gpus.launch_on_gpus(print)
    assert str(refused.value) == message
    with pytest.raises(notebook_gpus.CudaInitialisedError):
        notebook_gpus.torchrun_on_gpus("multigpu.ddp")
    assert message in (project_root() / "docs/gpu.md").read_text().replace("\n", " ")


def test_without_torch_imported_nothing_counts_as_initialised():
    code = (
        "import sys; from multigpu.runtime.launch import notebook_gpus as n; "
        "print(n.cuda_initialised(), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "False False\n", done.stderr
