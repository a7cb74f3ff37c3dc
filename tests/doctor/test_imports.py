"""Packages imported for real in a child process: broken, shadowed, hanging or
crashing packages, each simulated with a small package of its own."""

import sys
from pathlib import Path

import numpy
import pytest

from multigpu.doctor.environment import check_packages, install_command, shown_python
from multigpu.doctor.imports import (
    ImportProblem,
    broken_distributions,
    import_packages,
    not_importable,
    shadow,
)
from multigpu.doctor.result import FAIL, OK
from tests.doctor.test_environment import PINS, packages


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """``on_path(name, source)``: a package ``name`` whose ``__init__.py`` is
    ``source``, in a folder on PYTHONPATH (where the child finds it first)."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))  # as the child's sys.path

    def make(name, source):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
        return tmp_path / name

    return make


def test_a_package_that_raises_on_import_is_named_with_its_error(on_path):
    folder = on_path("doctor_broken", "raise ImportError('simulated\\nsecond line')")
    found = import_packages(["tqdm", "doctor_broken", "doctor_not_installed"])
    assert sorted(found) == ["doctor_broken", "doctor_not_installed"]
    broken = found["doctor_broken"]
    assert broken.error == "ImportError: simulated"
    assert Path(broken.where) == Path(broken.origin) == folder / "__init__.py"
    missing = found["doctor_not_installed"].error
    assert missing == "ModuleNotFoundError: No module named 'doctor_not_installed'"


def test_a_package_that_hangs_or_kills_the_child_is_the_one_named(on_path):
    on_path("doctor_hangs", "import time\ntime.sleep(60)")
    on_path("doctor_exits", "import os\nos._exit(3)")
    on_path("doctor_crashes", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    # 5 s: Python's own start must fit in it on a busy machine (the hang is 60 s)
    found = import_packages(["doctor_hangs", "numpy"], timeout=5.0)
    assert found == {
        "doctor_hangs": ImportProblem(
            "doctor_hangs", "did not finish importing within 5 s"
        )
    }
    found = import_packages(["doctor_exits", "tqdm"])
    assert found["doctor_exits"].error == (
        "the Python importing it ended with exit code 3"
    )
    found = import_packages(["tqdm", "doctor_crashes"])
    assert found["doctor_crashes"].error == (
        "the Python importing it was killed by SIGKILL"
    )


def test_a_folder_that_hides_numpy_gets_a_fix_that_names_it(tmp_path, monkeypatch):
    hiding = tmp_path / "numpy"
    hiding.mkdir()
    (hiding / "__init__.py").write_text("raise ImportError('numpy is broken')")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    error = "ImportError: numpy is broken"
    where = str(hiding / "__init__.py")
    problems = {  # torch fails inside the numpy that hides the real one
        "torch": ImportProblem("torch", error, where, str(Path(numpy.__file__))),
        "numpy": ImportProblem("numpy", error, where, where),
    }
    result = check_packages(PINS, packages(), lambda: problems)
    assert result.status == FAIL
    assert result.measured == f"torch and numpy do not import ({error})"
    assert result.fix == (
        f"rename or move away {hiding} (on PYTHONPATH): Python imports it instead "
        "of the installed numpy"
    )
    monkeypatch.chdir(tmp_path)
    assert shadow(problems["numpy"]) == (str(hiding), "numpy", "in the working folder")


def test_a_broken_install_gets_a_reinstall_of_the_package_that_raised():
    inside = str(Path(numpy.__file__).parent / "_core" / "multiarray.py")
    problem = ImportProblem("torch", "ImportError: bad", inside, None)
    assert shadow(problem) is None
    assert broken_distributions([problem]) == ["numpy"]
    result = check_packages(PINS, packages(), lambda: {"torch": problem})
    assert (result.status, result.measured) == (
        FAIL,
        "torch does not import (ImportError: bad)",
    )
    assert result.fix == (
        f"{shown_python()} -m pip install --force-reinstall --no-deps -c "
        "constraints.txt numpy"
    )
    assert install_command().startswith(shown_python())


def test_importing_packages_is_passed_as_the_versions_are():
    assert check_packages(PINS, packages(), lambda: {}).status == OK


def test_checks_that_need_torch_are_not_run_where_it_does_not_import():
    problem = ImportProblem("doctor_torch", "ImportError: numpy is broken")
    result = not_importable("GPUs", "doctor_torch", lambda: {"doctor_torch": problem})
    assert result.status == FAIL
    assert result.measured == (
        "not checked: doctor_torch does not import (ImportError: numpy is broken)"
    )
    assert result.fix == "do the fix of `packages` above, then run the doctor again"
    assert "torch" in sys.modules  # imported here: no child needed to know
    assert not_importable("GPUs", "torch", lambda: {"torch": problem}) is None
