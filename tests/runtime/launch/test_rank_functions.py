"""Tests for multigpu.runtime.launch.rank_functions: a worker that new processes
cannot import, or a script they cannot read again, is refused before any process
starts."""

import shlex
import subprocess
import sys
import types

import pytest

from multigpu.runtime.launch import (
    WorkerNotImportableError,
    spawn,
)
from multigpu.runtime.launch.rank_functions import check_main_importable
from tests.runtime.launch.processes import descendants


def _local_worker(rank, world_size):
    return rank


def test_a_worker_from_a_notebook_is_refused_before_any_process_starts():
    def nested(rank, world_size):
        return rank

    before = descendants()
    original = _local_worker.__module__
    _local_worker.__module__ = "__main__"  # what a notebook cell's function has
    try:
        with pytest.raises(WorkerNotImportableError, match="Move it into a module"):
            spawn(_local_worker, 2)
    finally:
        _local_worker.__module__ = original
    with pytest.raises(WorkerNotImportableError, match="lambda or a nested"):
        spawn(nested, 2)
    with pytest.raises(WorkerNotImportableError, match="lambda or a nested"):
        spawn(lambda rank, world_size: rank, 2)
    assert descendants() - before == set()


# What a learner pipes into Python from a shell: a correct script, with its guard.
STDIN_SCRIPT = """\
from multigpu.runtime.launch import spawn
from multigpu.runtime.launch.rank_functions import in_one_launch

if __name__ == "__main__":
    print(spawn(in_one_launch, 2, []))
"""


def test_a_script_read_from_standard_input_is_told_that_the_ranks_cannot_read_it(
    tmp_path,
):
    # Each rank re-imports the script that called spawn from its file; <stdin> has
    # none. It used to end in "needs an `if __name__ == '__main__':` guard".
    command = f"{shlex.quote(sys.executable)} - <<'EOF'\n{STDIN_SCRIPT}EOF\n"
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    error, _, message = last.partition(": ")
    assert error == "multigpu.runtime.launch.errors.WorkerNotImportableError"
    assert message.startswith("This script was read from standard input")
    assert "the new processes cannot read it again" in message
    assert "Save it to a file and run python your_script.py" in message
    assert result.stdout == ""


def test_a_script_that_no_longer_exists_is_named(monkeypatch, tmp_path):
    main = types.ModuleType("__main__")
    main.__file__ = str(tmp_path / "deleted.py")
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(WorkerNotImportableError) as caught:
        check_main_importable()
    assert str(tmp_path / "deleted.py") in str(caught.value)
    (tmp_path / "deleted.py").write_text("")
    check_main_importable()  # it exists again: nothing to say
