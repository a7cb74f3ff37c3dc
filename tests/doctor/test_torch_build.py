"""make lab's choice of PyTorch build (src/multigpu/doctor/torch_build.py), tested
without the network: a local package index in a temporary folder stands in for
PyTorch's CPU index (fake tiny wheels), a closed port for an unreachable one."""

import functools
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pip
import pytest

from multigpu.doctor import torch_build
from multigpu.doctor.environment import project_root

SCRIPT = project_root() / "src/multigpu/doctor/torch_build.py"
PINS = "torch==2.14.1\ntorchvision==0.29.1\n"


def make_wheel(folder: Path, name: str, version: str, requires=()) -> None:
    """A pure-Python wheel ``name-version`` that installs an empty package."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            wheel.writestr(path, text)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """``(root, url)``: a web server on 127.0.0.1 with two package indexes: ``cpu/``
    (torch 2.14.1+cpu, torchvision 0.29.1+cpu, as PyTorch's CPU index) and ``pypi/``
    (torch 2.14.1, which requires a CUDA package, and the dependencies)."""
    root = tmp_path_factory.mktemp("indexes")
    make_wheel(root / "cpu/torch", "torch", "2.14.1+cpu", ["fakedep"])
    make_wheel(root / "cpu/torchvision", "torchvision", "0.29.1+cpu", ["torch"])
    make_wheel(root / "pypi/torch", "torch", "2.14.1", ["fakedep", "fakenvidia"])
    make_wheel(root / "pypi/torchvision", "torchvision", "0.29.1", ["torch"])
    make_wheel(root / "pypi/fakedep", "fakedep", "1.0")
    make_wheel(root / "pypi/fakenvidia", "fakenvidia", "1.0")
    (root / "constraints.txt").write_text(PINS)
    handler = functools.partial(
        type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": print}),
        directory=str(root),
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def pip_environment(**extra) -> dict:
    """This environment without pip's settings (this machine's pip.conf and PIP_*
    variables name other indexes), plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**clean, "PIP_CONFIG_FILE": os.devnull, **extra}


@pytest.fixture
def venv(tmp_path):
    """A new virtual environment whose ``python -m pip`` is this one's pip."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True
    )
    python = tmp_path / "venv/bin/python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "pip").symlink_to(Path(pip.__file__).parent)
    return python


def installed(python) -> dict:
    done = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        env=pip_environment(),
        check=True,
    )
    return {row["name"]: row["version"] for row in json.loads(done.stdout)}


def run_script(python, root, **env):
    return subprocess.run(
        [python, SCRIPT, root / "constraints.txt"],
        capture_output=True,
        text=True,
        env=pip_environment(**env),
        timeout=60,
    )


def never(url):
    raise AssertionError("the index was probed where the answer does not matter")


@pytest.mark.parametrize(
    "requested,system,gpu,reached,build",
    [
        ("auto", "Linux", False, True, "cpu"),
        ("auto", "Linux", False, False, "pypi"),
        ("auto", "Linux", True, True, "pypi"),
        ("auto", "Darwin", False, True, "pypi"),
        ("auto", "Windows", False, True, "pypi"),
        ("cpu", "Linux", True, False, "cpu"),
        ("pypi", "Linux", False, True, "pypi"),
    ],
)
def test_the_decision_table(requested, system, gpu, reached, build):
    asked = []

    def reach(url):
        asked.append(url)
        return reached, "0.1 s" if reached else "no answer in 5 s"

    choice = torch_build.decide(requested, system, gpu, "http://index", reach)
    assert choice.build == build
    # the index is probed only on Linux without a GPU and without a choice
    assert asked == (
        ["http://index/torch/"]
        if (system, gpu, requested) == ("Linux", False, "auto")
        else []
    )


def test_a_wrong_choice_is_refused_by_name():
    with pytest.raises(ValueError, match="TORCH=gpu is not a choice: use TORCH=cpu"):
        torch_build.decide("gpu", "Linux", False, "http://index", never)


def test_the_probe_is_bounded_when_the_index_never_answers():
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        reached, seen = torch_build.probe(
            f"http://127.0.0.1:{silent.getsockname()[1]}/torch/", seconds=0.5
        )
    assert not reached and time.monotonic() - start < 1.5
    assert seen  # what was seen, for the one line


def test_the_probe_reaches_a_local_index_and_not_a_closed_port(indexes):
    root, url = indexes
    assert torch_build.probe(f"{url}/cpu/torch/")[0]
    start = time.monotonic()
    assert not torch_build.probe(f"http://127.0.0.1:{closed_port()}/torch/")[0]
    assert time.monotonic() - start < 2


def test_torch_cpu_installs_the_cpu_build_and_pip_keeps_it_under_the_pins(
    indexes, venv
):
    root, url = indexes
    done = run_script(venv, root, TORCH="cpu", MULTIGPU_TORCH_INDEX=f"{url}/cpu")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"torch: 2.14.1+cpu from {url}/cpu (TORCH=cpu)\n"
    # the Makefile's next step: every package under constraints.txt's pins
    subprocess.run(
        [venv, "-m", "pip", "install", "--quiet", "--index-url", f"{url}/pypi/"]
        + ["-c", root / "constraints.txt", "torch", "torchvision"],
        env=pip_environment(),
        check=True,
    )
    assert installed(venv) == {
        "torch": "2.14.1+cpu",  # torch==2.14.1 allows it: not replaced
        "torchvision": "0.29.1+cpu",
        "fakedep": "1.0",  # torch's own dependencies come from PyPI
    }  # and no CUDA package (fakenvidia)
    again = run_script(venv, root, TORCH="cpu", MULTIGPU_TORCH_INDEX=f"{url}/cpu")
    assert again.stdout == "torch: CPU build 2.14.1+cpu already installed (TORCH=cpu)\n"


def test_an_unreachable_index_falls_back_to_pypi_in_one_line_at_once(indexes, venv):
    root, _ = indexes
    index = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    done = run_script(venv, root, MULTIGPU_TORCH_INDEX=index)
    assert done.returncode == 0 and time.monotonic() - start < 10
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("torch: PyPI's wheel 2.14.1 (")
    if not torch_build.nvidia_gpu_present():
        assert f"Linux, no NVIDIA GPU, {index} not reachable" in lines[0]
    assert "torch" not in installed(venv)  # the next step installs PyPI's


def test_torch_cpu_stops_in_one_line_where_the_index_is_unreachable(indexes, venv):
    root, _ = indexes
    index = f"http://127.0.0.1:{closed_port()}"
    done = run_script(venv, root, TORCH="cpu", MULTIGPU_TORCH_INDEX=index)
    assert done.returncode == 1
    assert done.stdout.startswith(f"torch: TORCH=cpu but {index} is not reachable (")
    assert done.stdout.endswith("): check the network, or use TORCH=pypi\n")
    assert "\n" not in done.stdout.rstrip("\n")


def test_a_wrong_torch_value_stops_in_one_line(indexes, venv):
    root, _ = indexes
    done = run_script(venv, root, TORCH="cuda")
    assert done.returncode == 1
    assert done.stdout == (
        "torch: TORCH=cuda is not a choice: use TORCH=cpu, TORCH=pypi or leave it "
        "unset\n"
    )


def test_conda_users_extra_index_gives_pip_the_cpu_build(indexes):
    # environment.yml's route: PIP_EXTRA_INDEX_URL names the CPU index, the pin
    # stays torch==2.14.1; pip picks the highest version it allows, 2.14.1+cpu.
    root, url = indexes
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        + ["--quiet", "--report", "-", "-c", root / "constraints.txt", "torch"],
        capture_output=True,
        text=True,
        env=pip_environment(
            PIP_INDEX_URL=f"{url}/pypi/", PIP_EXTRA_INDEX_URL=f"{url}/cpu/"
        ),
        check=True,
    )
    chosen = {
        row["metadata"]["name"]: row["metadata"]["version"]
        for row in json.loads(done.stdout)["install"]
    }
    assert chosen == {"torch": "2.14.1+cpu", "fakedep": "1.0"}
    text = (project_root() / "environment.yml").read_text()
    assert f"PIP_EXTRA_INDEX_URL={torch_build.CPU_INDEX} conda env create" in text


def test_the_makefile_runs_the_choice_before_the_pinned_install():
    rule = (project_root() / "Makefile").read_text().split("$(STAMP): ")[1]
    choice = rule.index("src/multigpu/doctor/torch_build.py constraints.txt")
    assert choice < rule.index('-c constraints.txt -e ".[dev]"')


def test_the_build_text_names_cuda_or_cpu():
    assert torch_build.build_text("2.14.1+cpu", None) == (
        "torch 2.14.1+cpu, CPU-only build"
    )
    assert torch_build.build_text("2.14.1", "13.0") == "torch 2.14.1, CUDA 13.0 build"
    installed_cuda = torch_build.torch_cuda_version()
    import torch

    assert installed_cuda == torch.version.cuda  # read without importing torch
    assert torch_build.check_torch_build().measured.startswith(
        torch_build.build_text(torch_build.installed("torch"), installed_cuda)
    )
