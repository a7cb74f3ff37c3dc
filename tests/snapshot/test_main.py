"""Notebook 11's torchrun script, ``python -m multigpu.snapshot``: the commands its
docstrings print run from a shell, a restart resuming from the snapshot; an option
that does not fit the run is one line; a finished, mismatched or disagreeing run is
refused in one line. Its ranks' other behaviour from a shell: test_script.py."""

import importlib
import shlex

import pytest
import torch.distributed as dist

from multigpu.snapshot import read_events, record_event
from tests.ddp.scripts import (
    SHELL_TIMEOUT,
    as_rank_0_of,
    check_one_line,
    configuration_walk,
    docstring_commands,
    one_rank_runner,
)
from tests.faults.leftovers import run_shell

MAIN = "multigpu.snapshot.__main__"
SCRIPT = "torchrun --standalone --nproc-per-node=2 -m multigpu.snapshot"
PROG = "torchrun --standalone --nproc-per-node=N -m multigpu.snapshot"
# Both docstrings print the same restart command: one run from a shell.
COMMANDS = sorted(
    {
        command
        for name in ("multigpu.snapshot", MAIN)
        for command in docstring_commands(importlib.import_module(name).__doc__)
    }
)

WRONG_OPTIONS = [
    (
        "--kill-rank 5 --kill-at-step 3",
        "--kill-rank 5 is not a rank of this run: torchrun started 2 (0 to 1). "
        "Pass a rank from 0 to 1, or start more ranks.",
    ),
    (
        "--samples 256 --epochs 2 --kill-rank 1 --kill-at-step 8",
        "--kill-at-step 8 never comes: this run trains 8 steps (2 epochs of 4), so "
        "the fault would not fire. Pass a step from 0 to 7.",
    ),
    (
        "--samples 10",
        "--samples 10 gives 10 samples, fewer than one global batch (--batch-size "
        "64) on 2 ranks: no rank would train a single step. Pass more --samples or a "
        "smaller --batch-size.",
    ),
]


@pytest.mark.parametrize("options, message", WRONG_OPTIONS)
def test_a_wrong_option_is_one_line_before_the_group_starts(
    tmp_path, monkeypatch, capsys, options, message
):
    """The script's main on rank 0 of 2, as torchrun starts it, in this process."""
    as_rank_0_of(2, monkeypatch, tmp_path)
    main = importlib.import_module(MAIN).main
    with pytest.raises(SystemExit) as exited:
        main(["--snapshot", "s", *shlex.split(options)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"{PROG}: error: {message}\n"
    assert not dist.is_initialized()
    assert not (tmp_path / "s").exists()  # stopped before the loop made it


def test_the_configuration_is_walked_without_coming_back_to_the_script(
    tmp_path, monkeypatch
):
    """Every option is checked below ``__main__``, none in the DDP script's
    ``__main__`` (the snapshot script does not import it)."""
    as_rank_0_of(2, monkeypatch, tmp_path)
    main = importlib.import_module(MAIN).main
    walk = configuration_walk(main, ["--snapshot", "s", "--samples", "256"])
    assert walk.count(MAIN) == 1 and walk[0] == MAIN, walk
    assert "multigpu.ddp.__main__" not in walk


def test_a_fault_that_never_fires_is_one_line_from_torchrun(tmp_path):
    options, message = WRONG_OPTIONS[0]
    command = f"{SCRIPT} --snapshot s {options}"
    code, output = run_shell(command, SHELL_TIMEOUT, cwd=tmp_path)
    check_one_line(code, output, f"{PROG}: error: {message}")
    assert not (tmp_path / "s").exists()  # stopped before the loop made it


def test_without_torchrun_it_says_so_with_its_own_command(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert importlib.import_module(MAIN).main(["--snapshot", "s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: RANK, LOCAL_RANK, WORLD_SIZE not set")
    assert err.endswith(f"Run it as: {SCRIPT} --snapshot DIR\n")


def test_the_docstrings_print_the_restart_command_a_learner_pastes():
    assert len(COMMANDS) == 1, COMMANDS  # the package's and its script's: the same
    assert "--max-restarts" in COMMANDS[0] and "-m multigpu.snapshot " in COMMANDS[0]
    assert COMMANDS[0].startswith("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_in_the_docstrings_runs_from_a_shell(tmp_path, command):
    command = command.replace("DIR", str(tmp_path / "snapshots"))
    code, output = run_shell(command, 2 * SHELL_TIMEOUT, cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert output.splitlines()[-1] == "every rank holds the same weights: True"
    words = command.split()
    kill_step = int(words[words.index("--kill-at-step") + 1])
    every = int(words[words.index("--snapshot-every") + 1])
    resumed = (
        f"restart 1: resumed from the snapshot of step {kill_step // every * every} "
    )
    assert any(line.startswith(resumed) for line in output.splitlines()), output


def test_restarts_without_the_own_store_variable_are_refused_with_the_command(
    tmp_path,
):
    """torchrun reads TORCH_DISABLE_SHARE_RDZV_TCP_STORE before it starts the script,
    so the script cannot set it: it refuses to start, and gives the command. One
    restart, not the docstring's 3: each restart starts the ranks again."""
    command = COMMANDS[0].replace("DIR", str(tmp_path / "snapshots"))
    command = command.replace("--max-restarts=3", "--max-restarts=1")
    without = command.removeprefix("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ")
    code, output = run_shell(without, SHELL_TIMEOUT, cwd=tmp_path)
    check_one_line(
        code,
        output,
        f"{PROG}: error: torchrun restarts need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, "
        "which torchrun reads before it starts this script, so set it in the shell: "
        f"{command}",
    )
    assert not (tmp_path / "snapshots").exists()


@pytest.fixture
def script(tmp_path, monkeypatch, capsys):
    """The script's main in this process as the only rank of a gloo group."""
    main = importlib.import_module(MAIN).main
    small = ["--backend", "gloo", "--samples", "64", "--epochs", "1"]
    return one_rank_runner(main, monkeypatch, tmp_path, capsys, *small)


def test_a_finished_run_says_so_and_another_momentum_is_refused(script):
    assert script("--snapshot", "s")[0] == 0
    code, out, _ = script("--snapshot", "s")
    assert code == 0 and out[1].startswith("restart 0: the run is already complete")
    assert not any(line.startswith("epoch ") for line in out)
    code, _, err = script("--snapshot", "s", "--momentum", "0")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(
        "error: snapshot.pt was written by a run with 0.9 as its optimizer's "
        "momentum, and this run has 0.0"
    )


def test_a_run_whose_ranks_disagreed_fails_again_when_resumed(script, tmp_path):
    """torchrun restarts a round that failed the weights check; the restart finds
    the run complete and loads one snapshot everywhere, so it would agree: the
    first round's failure, noted in the folder, makes it fail again."""
    code, _, err = script("--snapshot", "nan", "--lr", "1e30", "--epochs", "2")
    assert code == 1 and len(err) == 1
    noted = [e for e in read_events(tmp_path / "nan") if e["event"] == "weights differ"]
    assert [e["message"] for e in noted] == err
    assert script("--snapshot", "s")[0] == 0  # a good run, then an earlier failure
    line = "every rank holds the same weights: False: w differs between rank 0"
    record_event(tmp_path / "s", "weights differ", message=line)
    code, out, err = script("--snapshot", "s")
    assert code == 1 and out[1].startswith("restart 0: the run is already complete")
    assert err == [
        f"{line} (found at the end of an earlier round of the run in s, whose "
        "snapshot this one resumed: start afresh in a new snapshot folder)"
    ]
