"""make gpu-check: its no-GPU report from a shell, and its GPU report built from
fake measurements (this machine has no GPU; the real run is on a GPU machine)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multigpu.doctor import gpu_check, gpu_items
from multigpu.doctor.environment import project_root
from multigpu.doctor.gpu_items import FAIL, OK, SKIP, Item
from multigpu.doctor.gpus import GPU_CELLS
from multigpu.doctor.notebook_cells import gpu_cells
from multigpu.doctor.result import UNICODE_MARKS

ROOT = project_root()
# What a GPU machine without Jupyter lacks: stand-ins that fail to import.
NOT_THERE = ("nbformat", "nbclient", "nbval", "jupyter_client", "ipykernel")
NOT_THERE += ("IPython", "nbconvert", "jupyterlab", "torchvision", "importlinter")
T4 = {"name": "Tesla T4", "memory_gib": 14.6, "capability": "7.5"}
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def probe(gpus, cuda="13.0", arch=CU130, warning=None):
    return {
        "torch": "2.11.0+cu130",
        "cuda": cuda,
        "arch": arch if gpus else [],
        "gpus": gpus,
        "nccl": "2.27.7" if gpus else None,
        "warning": warning,
    }


@pytest.fixture
def without_jupyter(tmp_path):
    """A PYTHONPATH entry where the Jupyter packages (and torchvision) fail to
    import, as on a GPU machine that has only torch and pytest."""
    for name in NOT_THERE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed here')\n"
        )
    return str(tmp_path)


def test_make_gpu_check_without_a_gpu_says_so_and_lists_what_it_would_run(
    tmp_path, without_jupyter
):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs the real check")
    report = tmp_path / "report.txt"
    done = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"PYTHON={sys.executable}"]
        + [f"GPU_REPORT={report}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": without_jupyter},
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    printed = lines[[line.startswith("gpu-check:") for line in lines].index(True) :]
    first = f"gpu-check: no GPU on this machine (torch {torch.__version__}, "
    assert printed[0].startswith(first) and printed[0].endswith(": nothing run")
    assert printed[-1] == f"report written to {report}"
    assert report.read_text().splitlines() == printed[:-1]
    assert printed[1:-1] == ["With GPUs it runs:"] + [
        f"  - {line}" for line in gpu_check.plan(ROOT)
    ]
    tests = gpu_items.gpu_tests(ROOT)
    assert f"  - {len(tests)} GPU-marked tests in " in done.stdout
    for notebook, _ in gpu_items.gpu_notebooks(ROOT):
        assert f"{Path(notebook).stem}: GPU cells " in done.stdout


def test_the_checking_process_never_imports_torch():
    code = "import sys, multigpu.doctor.gpu_check; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == "False\n", done.stderr


def test_every_gpu_cell_says_how_many_gpus_it_needs():
    found = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for index, need in gpu_cells(path):
            source = "".join(cells[index]["source"])
            assert re.search(
                r"cuda_device_count\(\) < \d|cuda\.is_available\(\)", source
            )
            found.setdefault(path.stem, []).append(need)
    two = {name: needs for name, needs in found.items() if max(needs) > 1}
    assert tuple((name, len(n), max(n)) for name, n in two.items()) == GPU_CELLS
    assert all(needs == [1] for name, needs in found.items() if name not in two)


@pytest.mark.parametrize(
    "capability,arch,runs",
    [
        ("7.5", CU130, True),  # a T4 on the CUDA 13 build
        ("6.0", CU130, False),  # a P100: CUDA 13 dropped it
        ("8.9", ["sm_80", "sm_86"], True),  # a cubin of the same major, older minor
        ("9.0", ["sm_80", "compute_80"], True),  # PTX, compiled for the GPU
        ("9.0", ["sm_80", "sm_86"], False),
        ("10.0", ["sm_90a", "sm_100a"], True),
    ],
)
def test_kernels_for_a_compute_capability(capability, arch, runs):
    assert gpu_check.has_kernels(capability, arch) is runs


def test_a_gpu_without_kernels_fails_in_one_line():
    p100 = {"name": "Tesla P100-PCIE-16GB", "memory_gib": 15.9, "capability": "6.0"}
    item = gpu_check.kernels_item(probe([p100]))
    assert item.status == FAIL
    assert item.text.startswith(
        "torch 2.11.0+cu130 has no kernels for compute capability 6.0 (built for "
        "sm_75, sm_80"
    )
    assert gpu_check.kernels_item(probe([T4, T4])) == Item(
        "torch kernels", OK, f"built for {', '.join(CU130)}"
    )


def test_the_no_gpu_lines():
    line, code = gpu_check.no_gpu_line(probe([]), driver=False)
    assert code == 0 and line == (
        "gpu-check: no GPU on this machine (torch 2.11.0+cu130, CUDA 13.0 build): "
        "nothing run"
    )
    line, code = gpu_check.no_gpu_line(probe([], cuda=None), driver=True)
    assert code == 1 and line.endswith("`rm -rf .venv && make lab TORCH=pypi`")
    too_old = "CUDA initialization: The NVIDIA driver on your system is too old"
    line, code = gpu_check.no_gpu_line(probe([], warning=too_old), driver=True)
    assert code == 1 and f"cannot use it: {too_old}. Update the driver" in line


def test_junit_cases_become_lines_with_the_gpus_they_need():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.core.test_devices" name="test_real" time="0.12"/>
      <testcase classname="tests.test_syncbn" name="test_two" time="0">
        <skipped message="needs 2 CUDA GPU(s), found 1"/></testcase>
      <testcase classname="tests.ddp.test_loop" name="test_bad" time="1">
        <failure message="AssertionError: not equal&#10;more">trace</failure>
      </testcase></testsuite></testsuites>"""
    assert gpu_items.test_items(xml, gpus=1) == [
        Item("tests/core/test_devices.py::test_real", OK, "passed in 0.1 s"),
        Item(
            "tests/test_syncbn.py::test_two",
            SKIP,
            "skipped: needs 2 GPUs, this machine has 1",
        ),
        Item("tests/ddp/test_loop.py::test_bad", FAIL, "AssertionError: not equal"),
    ]


@pytest.fixture
def fake_children(monkeypatch):
    """Replace every child process with canned answers: ``answers[first
    argument after -m] = (status, stdout, stderr)``; the calls are recorded."""
    calls, answers = [], {}

    def child(arguments, seconds, root, env=None):
        calls.append(arguments)
        return answers[
            arguments[1]
            if arguments[1] != "multigpu.doctor.gpu_measure"
            else arguments[2]
        ]

    monkeypatch.setattr(gpu_items, "child", child)
    monkeypatch.setattr(gpu_check, "child", child)
    return calls, answers


def test_one_gpu_runs_the_one_gpu_items_and_skips_the_others(fake_children):
    calls, answers = fake_children
    answers["ddp-step"] = (
        0,
        '{"backend": "nccl", "ms": 1.234, "batch_per_gpu": 256}',
        "",
    )
    cell = {
        "index": 29,
        "gpus": 1,
        "output": "batch in pinned memory: True\ncopied to cuda:0",
        "error": None,
    }
    answers["multigpu.doctor.notebook_cells"] = (
        0,
        json.dumps({"cells": [cell], "error": None}),
        "",
    )
    items = gpu_items.run_ddp_steps(1, 60, ROOT) + gpu_items.run_all_reduce(1, 60, ROOT)
    items += gpu_items.run_dp_memory(1, 60, ROOT) + gpu_items.run_notebooks(1, 60, ROOT)
    assert items[:4] == [
        Item("DDP step, 1 GPU", OK, "1.23 ms per step (nccl), batch 256 per GPU"),
        Item("DDP step, 2 GPUs", SKIP, "skipped: needs 2 GPUs, this machine has 1"),
        Item("nccl all-reduce", SKIP, "skipped: needs 2 GPUs, this machine has 1"),
        Item("DataParallel memory", SKIP, "skipped: needs 2 GPUs, this machine has 1"),
    ]
    assert items[4] == Item(
        "01 cell 29", OK, "printed: batch in pinned memory: True | copied to cuda:0"
    )
    assert [i.text for i in items[5:]] == [
        "skipped: needs 2 GPUs, this machine has 1"
    ] * 4
    ran = [c for c in calls if c[1] == "multigpu.doctor.notebook_cells"]
    assert [c[2] for c in ran] == ["notebooks/01_single_device_baseline.ipynb"]


def test_the_gpu_report_and_its_exit_status(fake_children, monkeypatch, tmp_path):
    calls, answers = fake_children
    answers["probe"] = (0, json.dumps(probe([T4, T4])), "")
    monkeypatch.setattr(
        gpu_check,
        "RUNNERS",
        (
            (lambda gpus, seconds, root: [Item("a", OK, f"{gpus} GPUs")], 0.5),
            (lambda gpus, seconds, root: 1 / 0, 0.5),  # a runner's own bug
            (lambda gpus, seconds, root: [Item("c", SKIP, "skipped: why")], 0.5),
        ),
    )

    class Out:
        encoding = "utf-8"
        text = ""

        def write(self, text):
            Out.text += text

        def flush(self):
            pass

    code = gpu_check.main(str(tmp_path / "r.txt"), Out())
    lines = (tmp_path / "r.txt").read_text().splitlines()
    assert code == 1  # the runner that raised
    assert lines[0] == (
        "gpu-check: torch 2.11.0+cu130 (CUDA 13.0), nccl 2.27.7, 2 GPUs: Tesla T4 "
        "(14.6 GiB, compute capability 7.5), Tesla T4 (14.6 GiB, compute capability "
        "7.5)"
    )
    marks = UNICODE_MARKS
    assert lines[1].startswith(f"{marks['ok']}  torch kernels")
    assert lines[2] == f"{marks['ok']}  {'a':<24} 2 GPUs"
    assert (
        lines[3].startswith(f"{marks['fail']}  <lambda>")
        and "ZeroDivisionError" in lines[3]
    )
    assert lines[4] == f"-  {'c':<24} skipped: why"
    assert re.fullmatch(
        r"gpu-check: 2 ✓ 1 ✗ 1 skipped in \d+ s with torch 2.11.0\+cu130", lines[5]
    )
    assert Out.text.splitlines()[:-1] == lines


def test_utilisation_is_reported_per_gpu_or_says_why_not(monkeypatch):
    rows = [[0, 30, 900], [1, 10, 800], [0, 50, 1000], [1, 30, 850]]
    assert gpu_items.utilisation_item(rows, None) == Item(
        "GPU utilisation",
        OK,
        "GPU 0 max 50%, mean 40%, memory up to 1000 MiB; GPU 1 max 30%, mean 20%, "
        "memory up to 850 MiB (2 samples, nvidia-smi)",
    )
    monkeypatch.setattr(gpu_items.shutil, "which", lambda name: None)
    why = gpu_items.sample_utilisation(None, [])
    assert gpu_items.utilisation_item([], why) == Item(
        "GPU utilisation", SKIP, "not sampled: nvidia-smi not found"
    )


def test_gpu_cells_run_without_jupyter(tmp_path, without_jupyter):
    def cell(source, tags=()):
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source}

    notebook = {
        "cells": [
            cell("%xmode Minimal\nfrom pathlib import Path\nvalue = 6 * 7"),
            {"cell_type": "markdown", "metadata": {}, "source": "text"},
            cell("raise ValueError('shown on purpose')", ["raises-exception"]),
            cell("print('left out')"),
            cell(
                "if value < 2:\n    pass\nelse:\n    print(value, Path.cwd().name)",
                ["nbval-skip"],
            ),
            cell("print('after the last GPU cell: not run')"),
        ]
    }
    (tmp_path / "lesson").mkdir()
    path = tmp_path / "lesson" / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    done = subprocess.run(
        [sys.executable, "-m", "multigpu.doctor.notebook_cells", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": without_jupyter},
    )
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "cells": [{"index": 4, "gpus": 1, "output": "42 lesson", "error": None}],
        "error": None,
    }
    assert "not run" not in done.stdout


def test_a_childs_failure_is_one_line_the_course_wrote_where_there_is_one():
    torchrun_output = (
        "torchrun -m multigpu.ddp: error: --backend nccl needs a GPU for every rank\n"
        "E1128 failed (exitcode: 2) local_rank: 0\nTraceback ...\n" + "=" * 60 + "\n"
        "multigpu.ddp FAILED\n" + "-" * 60 + "\n"
    )
    assert gpu_items.failure_text(1, torchrun_output) == (
        "exit status 1: torchrun -m multigpu.ddp: error: --backend nccl needs a GPU "
        "for every rank"
    )
    assert gpu_items.failure_text(1, "Traceback\nValueError: bad\n" + "=" * 9) == (
        "exit status 1: ValueError: bad"
    )
    assert gpu_items.failure_text(124, "") == "exit status 124: no error output"


def test_the_4d_script_item_reads_the_scripts_own_verdict(monkeypatch):
    import multigpu.runtime.launch as launch

    started = []

    def fake(stdout, status=0):
        def run(module, ranks, *arguments, **options):
            started.append((module, ranks, arguments))
            return subprocess.CompletedProcess([], status, stdout, "")

        return run

    ok = (
        "grid pp2 on 2 ranks, nccl, cuda\nstep 0: loss 6.8668\n"
        "every rank equal to one process (max |diff| < 1e-10): True\n"
    )
    monkeypatch.setattr(launch, "run_torchrun", fake(ok))
    (item,) = gpu_items.run_gpt4d(2, 60, ROOT)
    assert item == Item(
        "4-D GPT on nccl, 2 ranks",
        OK,
        "grid pp2 on 2 ranks, nccl, cuda; every rank equal to one process "
        "(max |diff| < 1e-10): True",
    )
    assert started[-1] == (
        "multigpu.gpt4d",
        2,
        ("--pp", "2", "--steps", "2", "--backend", "nccl"),
    )
    monkeypatch.setattr(launch, "run_torchrun", fake(ok.replace("True", "False")))
    assert gpu_items.run_gpt4d(1, 60, ROOT)[0].status == FAIL
    assert started[-1][1:] == (1, ("--steps", "2", "--backend", "nccl"))
    monkeypatch.setattr(launch, "run_torchrun", fake("", status=1))
    assert gpu_items.run_gpt4d(1, 60, ROOT)[0].status == FAIL
