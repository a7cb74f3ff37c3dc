"""Fixtures of the tests of launch."""

import pytest

from multigpu.ranks import collectives as collective_ranks
from multigpu.runtime.launch import spawn
from tests.runtime.launch.processes import descendants


@pytest.fixture
def no_leftovers():
    """Fail the test if a process it started outlives it."""
    spawn(
        collective_ranks.whoami_rank, 1
    )  # starts the long-lived forkserver before the snapshot
    before = descendants()
    yield
    assert descendants() - before == set()
