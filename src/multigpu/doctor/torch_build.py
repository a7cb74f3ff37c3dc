"""Which PyTorch build ``make lab`` installs, and which one is installed.

The Makefile runs this file with the new ``.venv``'s Python before the rest of the
install (the standard library only: torch is not there yet)::

    .venv/bin/python src/multigpu/doctor/torch_build.py constraints.txt

It prints one line saying what it chose and why, then installs torch and
torchvision at the versions of ``constraints.txt``:

- Linux without an NVIDIA GPU: PyTorch's CPU build (``torch==2.14.1+cpu``, about
  190 MB) from its CPU index, when that index answers within ``PROBE_S`` seconds;
  otherwise nothing here, and the next step installs PyPI's wheel (about 5.5 GB
  with the CUDA packages it requires).
- Linux with an NVIDIA GPU, macOS, Windows: PyPI's wheel (CUDA on Linux; CPU-only
  already on macOS and Windows).
- ``TORCH=cpu`` or ``TORCH=pypi`` forces either (``TORCH=cpu`` then fails in one
  line where the index cannot be reached, instead of falling back).

``MULTIGPU_TORCH_INDEX`` replaces the CPU index's address (a mirror, or the tests'
local index). pip never waits on an unreachable index: the probe runs first, in a
thread bounded by ``PROBE_S``. The doctor's ``torch build`` line
(:func:`check_torch_build`) says which build is installed (docs/gpu.md).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_S = 5.0
PACKAGES = ("torch", "torchvision")
CHOICES = ("auto", "cpu", "pypi")


@dataclass(frozen=True)
class Choice:
    """What to install: ``build`` "cpu" (PyTorch's CPU index) or "pypi", ``why``
    (the reason the one line gives), ``forced`` (by ``TORCH``) and ``replace_cpu``
    (an installed CPU build must go: a GPU is here, or ``TORCH=pypi``)."""

    build: str
    why: str
    forced: bool = False
    replace_cpu: bool = False


def read_pins(constraints: Path) -> dict[str, str]:
    """``{"torch": "2.14.1", ...}``: the ``name==version`` lines of ``constraints``."""
    pins = {}
    for line in constraints.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver is loaded or ``nvidia-smi`` exists (no CUDA call)."""
    return (
        Path("/proc/driver/nvidia/version").exists()
        or shutil.which("nvidia-smi") is not None
    )


def probe(url: str, seconds: float = PROBE_S) -> tuple[bool, str]:
    """Whether ``url`` answers within ``seconds`` (name lookup included, which
    urllib's own timeout does not bound), and what was seen: ``(True, "0.3 s")``
    or ``(False, "no answer in 5 s")``."""
    found: list[tuple[bool, str]] = []
    start = time.monotonic()

    def fetch() -> None:
        try:
            with urllib.request.urlopen(url, timeout=seconds) as response:
                response.read(1)
            found.append((True, f"{time.monotonic() - start:.1f} s"))
        except Exception as error:  # any failure means "not reachable"
            found.append((False, " ".join(str(error).split())[:80]))

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(seconds)
    return found[0] if found else (False, f"no answer in {seconds:g} s")


def decide(
    requested: str,
    system: str,
    gpu: bool,
    index: str,
    reach=probe,
) -> Choice:
    """The build to install for ``requested`` ("auto", "cpu", "pypi") on
    ``system`` ("Linux", "Darwin", "Windows"), ``gpu`` (an NVIDIA GPU present);
    ``reach(url)`` is asked only where the answer matters."""
    if requested not in CHOICES:
        raise ValueError(
            f"TORCH={requested} is not a choice: use TORCH=cpu, TORCH=pypi or "
            "leave it unset"
        )
    if requested == "pypi":
        return Choice("pypi", "TORCH=pypi", forced=True, replace_cpu=True)
    if system != "Linux":
        name = {"Darwin": "macOS"}.get(system, system)
        return Choice("pypi", f"{name}: PyPI's wheel is CPU-only already")
    if requested == "cpu":
        return Choice("cpu", "TORCH=cpu", forced=True)
    if gpu:
        return Choice(
            "pypi", "Linux with an NVIDIA GPU: PyPI's CUDA wheel", replace_cpu=True
        )
    reached, seen = reach(index + "/torch/")
    if reached:
        return Choice("cpu", f"Linux, no NVIDIA GPU, {index} answered in {seen}")
    return Choice(
        "pypi",
        f"Linux, no NVIDIA GPU, {index} not reachable ({seen}); PyPI's wheel "
        "brings its CUDA packages, about 5.5 GB",
    )


def installed(name: str) -> str | None:
    """The installed version of ``name`` in this environment, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pip_command(choice: Choice, pins: dict[str, str], index: str) -> list[str]:
    """The pip command that installs ``choice``'s torch and torchvision."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile"]
    if choice.build == "cpu":
        wanted = [f"{name}=={pins[name]}+cpu" for name in PACKAGES if name in pins]
        return [
            *pip,
            "--no-deps",
            "--index-url",
            index,
            "--timeout",
            "20",
            "--retries",
            "1",
            *wanted,
        ]
    wanted = [f"{name}=={pins[name]}" for name in PACKAGES if name in pins]
    return [*pip, "--no-deps", "--force-reinstall", *wanted]


def install(constraints: Path, requested: str | None = None) -> int:
    """Decide, print the one line, install torch and torchvision where needed
    (``make lab``'s set-up); 0, or 1 where a forced choice failed."""
    requested = (requested or os.environ.get("TORCH") or "auto").strip().lower()
    index = os.environ.get("MULTIGPU_TORCH_INDEX", CPU_INDEX).rstrip("/")
    pins = read_pins(constraints)
    try:
        choice = decide(requested, platform.system(), nvidia_gpu_present(), index)
    except ValueError as error:
        print(f"torch: {error}", flush=True)
        return 1
    have = installed("torch")
    have_cpu = have is not None and have.endswith("+cpu")
    version = pins.get("torch", "?")
    if choice.build == "cpu" and have == f"{version}+cpu":
        print(f"torch: CPU build {have} already installed ({choice.why})", flush=True)
        return 0
    if choice.build == "pypi" and not (have_cpu and choice.replace_cpu):
        what = f"keeps the CPU build {have}" if have_cpu else f"PyPI's wheel {version}"
        print(f"torch: {what} ({choice.why})", flush=True)
        return 0
    if choice.build == "cpu" and choice.forced:
        reached, seen = probe(index + "/torch/")
        if not reached:
            print(
                f"torch: TORCH=cpu but {index} is not reachable ({seen}): check the "
                "network, or use TORCH=pypi",
                flush=True,
            )
            return 1
    where = index if choice.build == "cpu" else "PyPI"
    done = subprocess.run(pip_command(choice, pins, index), check=False)
    if done.returncode == 0:
        label = f"{version}+cpu" if choice.build == "cpu" else version
        print(f"torch: {label} from {where} ({choice.why})", flush=True)
        return 0
    if choice.forced:
        print(
            f"torch: TORCH={choice.build} but pip could not install from {where}: "
            "check the network, or use the other TORCH choice",
            flush=True,
        )
        return 1
    print(
        f"torch: {index} failed during the install; PyPI's wheel {version} instead",
        flush=True,
    )
    return 0


def build_text(version: str | None, cuda: str | None) -> str:
    """``2.14.1+cpu, CPU-only build`` or ``2.14.1, CUDA 13.0 build``: what the
    doctor and ``make gpu-check`` say about the installed torch."""
    if version is None:
        return "torch not installed"
    if cuda:
        return f"torch {version}, CUDA {cuda} build"
    return f"torch {version}, CPU-only build"


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` read from torch's ``version.py``, without importing
    torch (None for a CPU build or where it cannot be read)."""
    try:
        files = metadata.files("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if str(file).replace("\\", "/") == "torch/version.py":
            text = Path(str(file.locate())).read_text()
            match = re.search(r"^cuda\b[^=]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            return match.group(1) if match else None
    return None


def check_torch_build():
    """The doctor's ``torch build`` line: the build installed, and the smaller
    one where it would do (docs/gpu.md)."""
    from multigpu.doctor.result import ok

    version, cuda = installed("torch"), torch_cuda_version()
    text = build_text(version, cuda)
    if cuda and platform.system() == "Linux" and not nvidia_gpu_present():
        text += (
            " (no NVIDIA GPU here: `rm -rf .venv && make lab TORCH=cpu` installs "
            "the CPU build, about 5 GB smaller)"
        )
    return ok("torch build", text)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if len(arguments) != 1:
        print("usage: torch_build.py CONSTRAINTS_FILE", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(install(Path(arguments[0])))
