"""Python, the pinned packages and the Jupyter kernel, each failure simulated."""

import json
import sys
from pathlib import Path

from multigpu.doctor.environment import (
    check_kernel,
    check_packages,
    check_python,
    install_command,
    project_root,
    python3_kernel,
    read_pins,
    shown_python,
)
from multigpu.doctor.result import FAIL, OK, WARN

PINS = {
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "numpy": "2.4.6",
    "nbval": "0.11.0",
}
INSTALLED = {
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "numpy": "2.4.6",
    "matplotlib": "3.11.2",
    "tqdm": "4.70.1",
    "jupyterlab": "4.6.6",
    "ipykernel": "7.4.0",
    "jupyter_client": "8.10.0",
    "nbval": "0.11.0",
    "nbconvert": "7.17.2",
    "psutil": "7.2.2",
}


def packages(**changed):
    """A version lookup: INSTALLED with ``changed`` (None: missing)."""
    versions = {**INSTALLED, **changed}
    return lambda name: versions.get(name)


def all_import():
    """The child's verdict where every package imports (test_imports.py runs it)."""
    return {}


def test_python_older_than_the_pins_fails_with_the_reinstall():
    result = check_python((3, 10, 12))
    assert result.status == FAIL
    assert (
        result.measured
        == "3.10.12 is older than 3.11.5, which the pinned packages need"
    )
    assert result.fix == (
        "install Python 3.11.5 or newer, then `rm -rf .venv && make lab "
        "PYTHON=python3.12` (the Python you installed)"
    )
    assert check_python((3, 11, 5)).status == OK
    assert check_python().status == OK  # this interpreter


def test_the_pins_are_read_from_constraints_txt():
    pins = read_pins(project_root() / "constraints.txt")
    assert pins["torch"].count(".") == 2
    assert "jupyter_client" in pins and "typing_extensions" in pins


def test_packages_as_pinned_pass_and_a_cpu_build_counts_as_the_pin():
    assert check_packages(PINS, packages(), all_import).status == OK
    assert check_packages(PINS, packages(torch="2.14.1+cpu"), all_import).status == OK
    # this environment and its constraints.txt: test_report.py's `make doctor`


def test_a_missing_package_fails_with_the_install_command():
    result = check_packages(PINS, packages(torchvision=None), all_import)
    assert result.status == FAIL
    assert result.measured == "torchvision missing"
    assert result.fix == install_command()


def test_commands_name_this_python_relative_to_the_working_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert shown_python(str(tmp_path / ".venv" / "bin" / "python")) == str(
        Path(".venv", "bin", "python")
    )
    assert shown_python("/opt/python3") == "/opt/python3"
    assert install_command() == (
        f"{sys.executable} -m pip install -c constraints.txt -e '.[dev]'"
    )


def test_torch_at_another_minor_version_fails_another_patch_warns():
    result = check_packages(PINS, packages(torch="2.13.0"), all_import)
    assert (result.status, result.measured) == (FAIL, "torch 2.13.0 (pinned 2.14.1)")
    result = check_packages(PINS, packages(torch="2.14.0"), all_import)
    assert result.status == WARN
    assert result.measured == "torch 2.14.0 (pinned 2.14.1): others as pinned"
    assert result.fix == install_command()


def test_other_packages_at_other_versions_or_a_missing_test_tool_only_warn():
    result = check_packages(PINS, packages(numpy="2.3.0", nbval=None), all_import)
    assert result.status == WARN
    assert (
        result.measured == "numpy 2.3.0 (pinned 2.4.6); nbval missing: others as pinned"
    )


def test_a_kernel_that_runs_another_python_fails_with_the_kernel_install():
    def elsewhere():
        return ["/usr/bin/python3", "-m", "ipykernel_launcher"], "/home/u/kernels/py"

    result = check_kernel(elsewhere, executable="/opt/course/.venv/bin/python")
    assert result.status == FAIL
    assert result.measured == (
        "python3 (/home/u/kernels/py) runs /usr/bin/python3, not this "
        "environment's /opt/course/.venv/bin/python"
    )
    assert (
        result.fix == "/opt/course/.venv/bin/python -m ipykernel install --sys-prefix"
    )


def test_a_kernel_spec_found_first_on_jupyter_path_is_the_one_checked(
    tmp_path, monkeypatch
):
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = ["/usr/bin/python3.9", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert python3_kernel() == (argv, str(spec))
    result = check_kernel()
    assert result.status == FAIL
    assert "runs /usr/bin/python3.9, not this environment's" in result.measured


def test_no_kernel_fails_and_this_environment_passes():
    def missing():
        raise LookupError("No such kernel named python3")

    result = check_kernel(missing, executable="/env/bin/python")
    assert result.status == FAIL
    assert result.measured == "no python3 kernel: No such kernel named python3"
    assert result.fix == "/env/bin/python -m ipykernel install --sys-prefix"
    same = str(Path(sys.executable).parent / "python3")
    here = check_kernel(lambda: ([same, "-m", "x"], "/k"))
    assert here.status == OK
    assert here.measured == f"notebooks will run on this course's Python ({same})"
    server = check_kernel(lambda: (["python", "-m", "x"], "/k"))
    assert server.status == OK
    assert server.measured.startswith(
        "notebooks will run on the Python that runs JupyterLab: this course's"
    )
    assert check_kernel().status == OK  # this environment's own kernel
