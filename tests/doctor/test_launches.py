"""The launches: real gloo ranks and their sums, and each failure simulated."""

import pytest

from multigpu.doctor.environment import install_command
from multigpu.doctor.launches import check_gloo, check_torchrun
from multigpu.doctor.result import FAIL, OK
from multigpu.ranks.doctor import expected_all_reduce
from multigpu.runtime.launch import TorchrunError, WorkerError

AGAIN = (
    "export GLOO_SOCKET_IFNAME=lo in the terminal before torchrun or python "
    "(add it to your shell profile), then run the doctor again"
)


def test_the_expected_sums_worked_out_by_hand():
    # rank r sends r + (0, 1, 2.5, -4); 2 ranks: 2 * values + 1; 4: 4 * values + 6
    assert expected_all_reduce(2) == [1.0, 3.0, 6.0, -7.0]
    assert expected_all_reduce(4) == [6.0, 10.0, 16.0, -10.0]


def test_gloo_starts_2_and_4_ranks_that_all_reduce_correctly():
    result = check_gloo()
    assert result.status == OK
    assert result.measured.startswith("2 ranks in ")
    assert ", 4 ranks in " in result.measured
    assert result.measured.endswith(": all-reduce correct")


def test_a_launch_that_raises_fails_with_the_loopback_fix():
    def launch(world_size):
        raise WorkerError("Rank 1 of 2 timed out waiting for its peers", 1, None, "")

    result = check_gloo(launch=launch, platform="linux")
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks failed: WorkerError: Rank 1 of 2 timed out waiting for its peers"
    )
    assert result.fix == AGAIN


def test_a_wrong_sum_fails_with_a_reinstall():
    def launch(world_size):
        return [expected_all_reduce(world_size)] * (world_size - 1) + [[0.0] * 4]

    result = check_gloo(launch=launch, platform="linux")
    assert result.status == FAIL
    assert result.measured.startswith("all-reduce over 2 ranks gave ")
    assert result.fix == install_command().replace(
        " install ", " install --force-reinstall "
    )
    assert "--force-reinstall -c constraints.txt" in result.fix


def test_torchrun_failing_names_the_first_error_and_the_fix():
    output = (
        'W1125 starting\n  File "x.py", line 3\n'
        "RuntimeError: [enforce fail at device.cc:84] Unable to find address for: en9\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "=====\n"
    )

    def run():
        message = "torchrun -m x exited with code 1; its output ends with:\n====="
        raise TorchrunError(message, output)

    result = check_torchrun(run, platform="linux")
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks failed: TorchrunError: torchrun -m x exited with code 1; first "
        "error: RuntimeError: [enforce fail at device.cc:84] Unable to find address "
        "for: en9"
    )
    assert result.fix == AGAIN


def test_torchrun_printing_something_else_fails():
    result = check_torchrun(lambda: "world_size=2 sum=4\n", platform="darwin")
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks ran but rank 0 printed 'world_size=2 sum=4', not 'world_size=2 sum=3'"
    )
    assert result.fix.startswith("export GLOO_SOCKET_IFNAME=lo0 ")


@pytest.mark.parametrize("error", [OSError("no such file: torchrun"), TimeoutError()])
def test_torchrun_errors_without_output_fail_too(error):
    def run():
        raise error

    result = check_torchrun(run, platform="linux")
    assert result.status == FAIL
    assert result.measured.startswith(f"2 ranks failed: {type(error).__name__}: ")
