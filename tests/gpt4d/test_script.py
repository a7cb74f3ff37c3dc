"""The 4-D torchrun script: its option checks refuse each impossible grid in one
line with exit status 2 without importing torch; and, from a shell, the two
commands its docstring prints: a 2-stage pipeline that trains equal to one process,
and a refusal torchrun reports as the ranks' status 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import multigpu.gpt4d.__main__ as script
from multigpu.gpt4d.cli import PROG, parse_args
from tests.ddp.refusals import stopped
from tests.ddp.scripts import SHELL_TIMEOUT, check_one_line, docstring_commands

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("options", "world_size", "words"),
    [
        (
            ["--dp", "2", "--tp", "3"],
            2,
            "dp*tp*pp*cp = 2*3*1*1 = 6, but the world has 2",
        ),
        (
            ["--tp", "2", "--heads", "3", "--dim", "6"],
            2,
            "heads 3 is not divisible by tp 2",
        ),
        (["--pp", "3"], 3, "layers 2 is not divisible by pp 3"),
        (["--cp", "3"], 3, "seq_len 8 is not divisible by cp 3"),
        (["--dp", "4", "--batch", "6"], 4, "a batch of 6 sequences cannot give"),
        (["--heads", "3"], 1, "--dim 8 is not divisible by --heads 3"),
        (["--steps", "0"], 1, "--steps is 0; give 1 or more."),
        (["--timeout", "0"], 1, "--timeout is 0"),
    ],
)
def test_an_impossible_grid_is_one_line_and_status_2(
    capsys, options, world_size, words
):
    environ = {"WORLD_SIZE": str(world_size), "RANK": "0"}
    message = stopped(capsys, PROG, parse_args, options, environ)
    assert words in message


def test_without_torchrun_it_says_to_use_torchrun(capsys):
    message = stopped(capsys, PROG, parse_args, ["--pp", "2"], {})
    assert "this is a torchrun script" in message


def test_the_checks_do_not_import_torch():
    code = (
        "import sys\n"
        "from multigpu.gpt4d.cli import parse_args\n"
        "args = parse_args(['--dp', '2', '--pp', '2'], {'WORLD_SIZE': '4'})\n"
        "print(args.grid.label(), 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "dp2 x pp2 False"


def _shell(command, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env["PATH"]
    done = subprocess.run(
        command,
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_docstrings_commands_run_from_a_shell(tmp_path):
    train, refuse = docstring_commands(script.__doc__)
    code, output = _shell(train, tmp_path)
    assert code == 0, output[-3000:]
    lines = output.splitlines()
    assert "grid pp2 on 2 ranks, gloo, cpu" in lines
    assert sum(line.startswith("step ") for line in lines) == 2
    assert "every rank equal to one process (max |diff| < 1e-10): True" in lines
    code, output = _shell(refuse, tmp_path)
    check_one_line(
        code,
        output,
        f"{PROG}: error: dp*tp*pp*cp = 2*3*1*1 = 6, but the world has 2 ranks; "
        "make the product equal the number of processes (--nproc-per-node).",
    )


def test_nccl_with_more_ranks_on_a_node_than_gpus_stops_every_rank(monkeypatch, capsys):
    from multigpu.gpt4d.script import pick_backend

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    crowded = {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    assert stopped(capsys, PROG, pick_backend, "auto", crowded) == (
        "nccl needs one GPU per rank: 2 ranks on this node and 1 GPUs; use "
        "--backend gloo or at most 1 ranks per node."
    )
    with pytest.raises(SystemExit) as caught:  # rank 1 stops too, silently
        pick_backend("auto", {**crowded, "RANK": "1", "LOCAL_RANK": "1"})
    assert caught.value.code == 2
    assert capsys.readouterr().err == ""
    alone = {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    backend, device = pick_backend("auto", alone)
    assert (backend, str(device)) == ("nccl", "cuda:0")
    assert pick_backend("gloo", alone)[0] == "gloo"
