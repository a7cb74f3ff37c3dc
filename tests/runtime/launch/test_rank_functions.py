"""Tests for multigpu.runtime.launch.rank_functions: a worker that new processes
cannot import is refused before any process starts."""

import pytest

from multigpu.runtime.launch import (
    WorkerNotImportableError,
    spawn,
)
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
