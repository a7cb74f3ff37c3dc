"""multigpu.runtime.quiet_ranks: a quiet rank under torchrun waits for torchrun to end
it (rank 0 prints the line first); elsewhere it exits at once. The scripts' shell
tests (tests/ddp, tests/snapshot, tests/gpt4d) check the line arrives through
torchrun."""

import pytest

from multigpu.runtime import quiet_ranks

UNDER_TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "2"}


@pytest.mark.parametrize(
    "environ, waits",
    [
        ({**UNDER_TORCHRUN, "RANK": "1"}, True),
        ({**UNDER_TORCHRUN, "RANK": "0"}, False),
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # not torchrun: a test, say
        ({}, False),
    ],
)
def test_only_a_quiet_rank_under_torchrun_waits(monkeypatch, environ, waits):
    slept = []
    monkeypatch.setattr(quiet_ranks.time, "sleep", slept.append)
    with pytest.raises(SystemExit) as exited:
        quiet_ranks.exit_quietly(environ)
    assert exited.value.code == 2
    assert slept == ([quiet_ranks.QUIET_RANK_WAIT_S] if waits else [])
