"""The check the option tests of both torchrun scripts (09's ``-m multigpu.ddp``,
11's ``-m multigpu.snapshot``) make of a refusal."""

import pytest


def stopped(capsys, prog: str, call, *args) -> str:
    """The one line a check prints as it stops the script with exit status 2, after
    the ``prog: error: `` it starts with."""
    with pytest.raises(SystemExit) as caught:
        call(*args)
    assert caught.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines  # no usage: one line
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0].removeprefix(f"{prog}: error: ")
