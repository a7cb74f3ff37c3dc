"""Disk, memory and cores, each shortage simulated."""

import sys

from multigpu.core.sizes import GiB, MiB
from multigpu.doctor.machine import (
    check_cores,
    check_disk,
    check_memory,
    free_disk,
    memory,
    usable_cores,
)
from multigpu.doctor.result import FAIL, OK, WARN


def test_a_nearly_full_disk_fails_and_a_small_margin_warns():
    result = check_disk(lambda: ("/home/u/multigpu", 300 * MiB))
    assert result.status == FAIL
    assert result.measured == "0.3 GiB free in /home/u/multigpu: below 1.0 GiB"
    assert result.fix == "free disk space in /home/u/multigpu (at least 5.0 GiB)"
    assert check_disk(lambda: ("/tmp", 3 * GiB)).status == WARN
    assert check_disk(lambda: ("/tmp", 50 * GiB)).status == OK


def test_the_disk_measured_is_the_fuller_of_the_folders(tmp_path):
    where, free = free_disk((str(tmp_path), "/"))
    assert where in (str(tmp_path), "/") and free > 0
    assert check_disk().status in (OK, WARN)


def test_too_little_memory_fails_with_what_to_close():
    result = check_memory(lambda: (1 * GiB, 8 * GiB))
    assert result.status == FAIL
    assert result.measured == "1.0 GiB available of 8.0 GiB: below 2.0 GiB"
    assert result.fix == (
        "close programs (browser tabs, IDEs) until 4.0 GiB are available, then "
        "run the doctor again"
    )
    assert check_memory(lambda: (3 * GiB, 8 * GiB)).status == WARN
    assert check_memory(lambda: (6 * GiB, 8 * GiB)).status == OK


def test_memory_that_cannot_be_measured_warns():
    result = check_memory(lambda: None)
    assert result.status == WARN
    assert result.fix == "install psutil (`make setup`) and run the doctor again"


def test_without_psutil_memory_comes_from_proc_meminfo(monkeypatch):
    with_psutil = memory()
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil: ImportError
    without = memory()
    if sys.platform == "linux":
        assert without is not None and without[1] == with_psutil[1]
    else:
        assert without is None


def test_fewer_cores_than_ranks_warns_that_the_4_rank_cells_are_slower():
    result = check_cores(2)
    assert result.status == WARN
    assert result.measured == (
        "2 cores: the 4-rank cells of 07-16 run, slower (4 processes share 2 cores)"
    )
    assert result.fix == (
        "nothing to install: expect those cells to take longer, and close other "
        "busy programs during the workshop"
    )
    assert check_cores(1).measured.startswith("1 core: ")
    assert check_cores(8).status == OK
    assert check_cores().measured.startswith(f"{usable_cores()} core")
