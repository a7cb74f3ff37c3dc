"""docs/gpu.md: every command it gives is classified here, and each one that can
run on a CPU machine is run by a test (named below); the GPU-only ones are run by
make gpu-check, the ones that need the network are checked against the pins."""

import re
import shlex
from subprocess import CompletedProcess

from multigpu.doctor.environment import project_root
from multigpu.doctor.torch_build import CPU_INDEX, read_pins
from multigpu.runtime.launch import notebook_gpus

ROOT = project_root()
CLONE = "git clone --depth 1 https://github.com/<owner>/multigpu.git"
SMI = "nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv -l 1"
CONDA = f"PIP_EXTRA_INDEX_URL={CPU_INDEX} conda env create -f environment.yml"
DDP = (
    "torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 1 --samples 512"
)
# command -> how it is checked
COMMANDS = {
    "!nvidia-smi": "GPU: the driver's version; make gpu-check calls nvidia-smi too",
    f"!{CLONE}": "network: clones the course",
    "%cd multigpu": "IPython: the folder the next cells run in",
    "!pip install -q -c constraints.txt -e .": "network: the pinned install",
    "!python -m multigpu.doctor --gpu": "run: test_gpu_check (make gpu-check runs it)",
    "!pip install -q --no-deps -e .": "network: the course alone",
    f"{CLONE} && cd multigpu": "network: clones the course",
    "make lab": "network: the set-up; its torch choice: test_torch_build",
    "make gpu-check": "run: test_gpu_check",
    "make gpu-check PYTHON=python3": "run: test_gpu_check, with this Python",
    DDP: "run: test_notebook_launch (the command torchrun_on_gpus runs)",
    SMI: "GPU: make gpu-check samples the same query",
    "rm -rf .venv && make lab TORCH=cpu": "network: its choice: test_torch_build",
    CONDA: "conda: pip's choice under it: test_torch_build",
}


def guide_commands() -> list[str]:
    text = (ROOT / "docs/gpu.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line]


def test_every_command_of_the_guide_is_classified():
    assert sorted(guide_commands()) == sorted(COMMANDS)


def test_the_python_cell_runs_the_guides_torchrun_command(monkeypatch):
    # torchrun_on_gpus hands its arguments to run_torchrun, which runs
    # `torchrun --standalone --nproc-per-node=N -m module args` (its contract)
    started = []
    monkeypatch.setattr(notebook_gpus, "gpu_count", lambda: 2)  # Kaggle's 2 x T4
    monkeypatch.setattr(
        notebook_gpus,
        "run_torchrun",
        lambda *args, **kwargs: started.append(args) or CompletedProcess([], 0, ""),
    )
    cell = (ROOT / "docs/gpu.md").read_text().split("```python\n")[1].split("```")[0]
    exec(cell, {})
    module, ranks, *arguments = started[0]
    shell = shlex.split(DDP)
    assert shell[:3] == ["torchrun", "--standalone", "--nproc-per-node=2"]
    assert [f"--nproc-per-node={ranks}", "-m", module, *arguments] == shell[2:]


def test_make_gpu_check_runs_the_guides_module_command():
    recipe = (ROOT / "Makefile").read_text().split("\ngpu-check:")[1].split("\n\n")[0]
    assert "-m multigpu.doctor \\\n\t\t--gpu" in recipe


def test_the_network_commands_install_the_pins():
    pins = read_pins(ROOT / "constraints.txt")
    assert "torch" in pins and "torchvision" in pins
    for command in COMMANDS:
        if "pip install" in command and "--no-deps" not in command:
            assert "-c constraints.txt" in command
    text = (ROOT / "docs/gpu.md").read_text()
    assert f"`torch=={pins['torch']}`" in text
    assert f"`torch=={pins['torch']}+cpu`" in text
