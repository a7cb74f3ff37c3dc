"""Tests for multigpu.runtime.scratch: learners' modules, importable here and by the
ranks."""

import os
import sys

import pytest

from multigpu.runtime import launch, scratch


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    # Python keeps compiled modules, as on a learner's machine, whatever this
    # environment says (PYTHONDONTWRITEBYTECODE): a rewritten module must not be
    # imported from its old compile.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    yield
    scratch.clean_up()


def test_a_written_module_is_imported_and_rewriting_gives_the_new_code():
    first = scratch.write_module("learner_step", "VALUE = 1\n")
    assert first.VALUE == 1
    again = scratch.write_module("learner_step", "VALUE = 2\n")
    assert again.VALUE == 2 and sys.modules["learner_step"] is again


def test_the_ranks_import_it_too():
    module = scratch.write_module(
        "learner_worker",
        "import torch\nimport torch.distributed as dist\n\n\n"
        "def total(rank, world_size):\n"
        "    value = torch.tensor([rank + 1.0])\n"
        "    dist.all_reduce(value)\n"
        "    return value.item()\n",
    )
    assert launch.spawn(module.total, 2, backend="gloo") == [3.0, 3.0]


def test_clean_up_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    scratch.write_module("learner_gone", "X = 0\n")
    folder = scratch.folder()
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(folder), "/somewhere/else"])
    scratch.clean_up()
    assert not folder.exists()
    assert str(folder) not in sys.path
    assert os.environ["PYTHONPATH"] == "/somewhere/else"
    assert "learner_gone" not in sys.modules


def test_a_bad_name_is_a_clear_error():
    with pytest.raises(ValueError) as raised:
        scratch.write_module("my-ring", "")
    assert str(raised.value) == (
        "'my-ring' is not a valid module name. Use letters, digits and underscores, "
        "not starting with a digit, e.g. my_ring."
    )


def test_the_cell_magic_writes_imports_and_prints_no_path(capsys):
    class Shell:  # what the extension uses of IPython's shell
        def __init__(self):
            self.magics = {}

        def register_magic_function(self, function, magic_kind, magic_name):
            self.magics[magic_kind, magic_name] = function

    shell = Shell()
    scratch.load_ipython_extension(shell)
    shell.magics["cell", "module"](" learner_magic ", "ANSWER = 42\n")
    import learner_magic

    assert learner_magic.ANSWER == 42
    shell.magics["cell", "module"]("learner_magic", "ANSWER = 43\n")
    import learner_magic  # noqa: F811  (as the notebook's next cell does)

    assert learner_magic.ANSWER == 43
    shell.magics["cell", "scratch_file"]("run_me.py", "import sys\nsys.exit(3)\n")
    assert (scratch.folder() / "run_me.py").read_text() == "import sys\nsys.exit(3)\n"
    assert "run_me" not in sys.modules  # written, not imported (not run)
    assert capsys.readouterr().out == (
        "wrote learner_magic.py; `import learner_magic` gives this version\n" * 2
        + "wrote run_me.py\n"
    )


def test_a_file_name_with_folders_is_refused():
    with pytest.raises(ValueError, match="not a plain file name"):
        scratch.write_file("../escape.py", "")
