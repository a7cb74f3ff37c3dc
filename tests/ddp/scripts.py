"""What the tests of the two torchrun scripts share (``python -m multigpu.ddp``,
``python -m multigpu.snapshot``): the commands their docstrings print, their
one-line errors, their ``main`` run in this process as rank 0, and the walk of
their configuration."""

import re
import socket
import sys

import torch.distributed as dist

SHELL_TIMEOUT = 240  # one torchrun run from a shell on a busy 2-core machine


def docstring_commands(text):
    """The shell commands in a docstring: lines that start with ``torchrun`` or
    with a variable and then ``torchrun``, with their ``\\`` continuations."""
    commands, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and re.match(r"^(\w+=\S+ )*torchrun ", stripped):
            current = ""
        if current is not None:
            current += stripped.rstrip("\\").strip() + " "
            if not stripped.endswith("\\"):
                commands.append(current.strip())
                current = None
    return commands


def script_errors(output):
    """The ranks' one-line errors: the usage errors and ``rank R: ...`` lines."""
    lines = output.splitlines()
    return [line for line in lines if ": error: " in line or line.startswith("rank ")]


def check_one_line(code, output, expected):
    """torchrun's output holds ``expected`` as the ranks' only error line, no
    traceback, and the status of a rank that stopped with 2."""
    assert script_errors(output) == [expected], output[-3000:]
    assert not any(line.startswith("[rank") for line in output.splitlines())
    assert "exitcode  : 2" in output  # torchrun's summary: the ranks' status
    assert code == 1  # torchrun's own: a rank failed


def as_rank_0_of(world_size, monkeypatch, tmp_path):
    """This process as rank 0 of ``world_size`` under torchrun's first launch,
    without restarts, in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    for name in ("TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


def one_rank_runner(main, monkeypatch, tmp_path, capsys, *small):
    """A function that runs a script's ``main`` in this process as the only rank of
    a gloo group, with the options ``small`` and its own, and returns (status,
    stdout lines, stderr lines)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    as_rank_0_of(1, monkeypatch, tmp_path)
    environ = {"LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**environ, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)

    def run(*options):
        code = main([*small, *options])
        assert not dist.is_initialized()
        out, err = capsys.readouterr()
        return code, out.splitlines(), err.splitlines()

    return run


class _Joined(BaseException):
    """Raised where a script joins its process group: its configuration is done."""


def configuration_walk(main, argv):
    """The lesson modules control passes through, in order (each once per visit),
    from ``main(argv)`` until it joins the process group, where it is stopped:
    the walk of the script's configuration. Modules of ``core`` and ``runtime``,
    below every lesson, are left out."""
    trail = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "join_group":
            raise _Joined
        if event in ("call", "return"):
            where = frame if event == "call" else frame.f_back
            name = where.f_globals.get("__name__", "") if where else ""
            lesson = not name.startswith(("multigpu.core", "multigpu.runtime"))
            if name.startswith("multigpu.") and lesson and trail[-1:] != [name]:
                trail.append(name)
        return tracer

    sys.settrace(tracer)
    try:
        main(argv)
    except _Joined:
        pass
    finally:
        sys.settrace(None)
    return trail
