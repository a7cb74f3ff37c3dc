"""The launches: real gloo ranks and their sums, and each failure simulated."""

import errno
import functools
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.doctor import launches
from multigpu.doctor.causes import ASK, launch_failure, slow_text
from multigpu.doctor.environment import install_command, project_root
from multigpu.doctor.launches import check_gloo, check_torchrun
from multigpu.doctor.network import local_addr_fix
from multigpu.doctor.result import FAIL, OK
from multigpu.ranks.doctor import expected_all_reduce
from multigpu.runtime.launch import (
    DeadlineExceededError,
    TorchrunError,
    WorkerError,
)

AGAIN = (
    "export GLOO_SOCKET_IFNAME=lo in the terminal before torchrun or python "
    "(add it to your shell profile), then run the doctor again"
)
REINSTALL = install_command().replace(" install ", " install --force-reinstall ")
BUSY = "close other busy programs, then run the doctor again"


def busy():
    """What slow_text says on a machine with 16 processes on 2 cores."""
    return slow_text(lambda: 16.0, lambda: 2)


def explained(elsewhere=None, refused=None):
    """launch_failure with the machine's answers given: gloo's address where it is
    not a loopback one, the error of a connection to 127.0.0.1, a busy machine."""
    return functools.partial(
        launch_failure,
        connect=lambda: refused,
        slow=busy,
        elsewhere=lambda: elsewhere,
    )


def down():
    return OSError(errno.ENETUNREACH, "Network is unreachable")


def test_the_expected_sums_worked_out_by_hand():
    # rank r sends r + (0, 1, 2.5, -4); 2 ranks: 2 * values + 1; 4: 4 * values + 6
    assert expected_all_reduce(2) == [1.0, 3.0, 6.0, -7.0]
    assert expected_all_reduce(4) == [6.0, 10.0, 16.0, -10.0]


@pytest.mark.alone  # the launches have limits in seconds, as on a laptop
def test_gloo_starts_2_and_4_ranks_that_all_reduce_correctly():
    result = check_gloo()
    assert result.status == OK
    assert result.measured.startswith("2 ranks in ")
    assert ", 4 ranks in " in result.measured
    assert result.measured.endswith(": all-reduce correct")


def test_a_launch_that_raises_is_explained_before_a_fix_is_chosen():
    def launch(world_size):
        raise WorkerError("Rank 1 of 2 failed with RuntimeError: x", 1, None, "")

    # gloo binds the host name's address, not 127.0.0.1: the loopback fix
    result = check_gloo(launch=launch, platform="linux", explain=explained("10.1.2.3"))
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks failed: WorkerError: Rank 1 of 2 failed with RuntimeError: x (gloo "
        "binds 10.1.2.3, the host name's address)"
    )
    assert result.fix == AGAIN
    # gloo binds 127.0.0.1 already: no network fix to offer
    result = check_gloo(launch=launch, platform="linux", explain=explained())
    assert result.measured == (
        "2 ranks failed: WorkerError: Rank 1 of 2 failed with RuntimeError: x"
    )
    assert result.fix == ASK


def test_a_loopback_that_is_down_fails_the_launches_without_starting_them():
    def launch(*args):
        raise AssertionError("started a launch that cannot connect")

    for check in (check_gloo, check_torchrun):
        result = check(launch, platform="linux", connect=down)
        assert result.status == FAIL
        assert result.measured == (
            "not started: nothing can connect to 127.0.0.1 ([Errno 101] Network is "
            "unreachable), where every rank connects"
        )
        assert result.fix == (
            "bring the loopback interface lo up: `sudo ip link set lo up`, then run "
            "the doctor again"
        )


def test_a_first_launch_past_its_deadline_is_a_busy_machine_not_the_network():
    def launch(world_size):  # 16 busy processes on 2 cores: the forkserver is late
        message = "The launch did not finish within its deadline of 20 s"
        raise DeadlineExceededError(message, 0, "", 20.0, range(world_size))

    result = check_gloo(launch=launch, platform="linux", explain=explained())
    assert result.status == FAIL
    assert result.measured == (
        "the launch of 2 ranks started but did not finish within 20 s; the load "
        "average is 16.0 on 2 cores: this machine is busy; 127.0.0.1 connects: not a "
        "network fault"
    )
    assert result.fix == BUSY
    # 127.0.0.1 refusing comes first: then it is the network after all
    result = check_gloo(launch=launch, explain=explained(refused=down()))
    assert "nothing can connect to 127.0.0.1" in result.measured


def test_a_real_launch_that_misses_its_deadline_is_recognised(monkeypatch):
    monkeypatch.setattr(launches, "SPAWN_DEADLINE_S", 0.01)
    result = check_gloo(explain=explained())
    assert result.status == FAIL
    assert result.measured.startswith(
        "the launch of 2 ranks started but did not finish within 0.01 s; "
    )
    assert result.fix == BUSY


def test_a_quiet_machine_that_is_slow_is_asked_to_try_again():
    assert slow_text(lambda: 0.5, lambda: 8) == (
        "; the load average is 0.5 on 8 cores",
        f"run the doctor again; if it fails again, {ASK}",
    )
    assert slow_text(lambda: None, lambda: 1) == ("", BUSY)


def test_a_wrong_sum_fails_with_a_reinstall():
    def launch(world_size):
        return [expected_all_reduce(world_size)] * (world_size - 1) + [[0.0] * 4]

    result = check_gloo(launch=launch, platform="linux")
    assert result.status == FAIL
    assert result.measured.startswith("all-reduce over 2 ranks gave ")
    assert result.fix == REINSTALL
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

    result = check_torchrun(
        run, "linux", lambda: None, explain=explained(elsewhere="10.1.2.3")
    )
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks failed: TorchrunError: torchrun -m x exited with code 1; first "
        "error: RuntimeError: [enforce fail at device.cc:84] Unable to find address "
        "for: en9 (gloo binds 10.1.2.3, the host name's address)"
    )
    assert result.fix == AGAIN


def test_torchrun_printing_something_else_fails():
    result = check_torchrun(lambda: "world_size=2 sum=4\n", "darwin", lambda: None)
    assert result.status == FAIL
    assert result.measured == (
        "2 ranks ran but rank 0 printed 'world_size=2 sum=4', not 'world_size=2 sum=3'"
    )
    assert result.fix == REINSTALL


@pytest.mark.parametrize("error", [OSError("no such file: torchrun"), TimeoutError()])
def test_torchrun_errors_without_output_fail_too(error):
    def run():
        raise error

    result = check_torchrun(run, "linux", lambda: None, explain=explained())
    assert result.status == FAIL
    assert result.measured.startswith(f"2 ranks failed: {type(error).__name__}: ")
    assert result.fix == ASK


def test_torchrun_past_its_time_limit_is_a_busy_machine(monkeypatch):
    monkeypatch.setattr(launches, "TORCHRUN_DEADLINE_S", 0.0)

    def run():
        raise TorchrunError("torchrun -m x did not finish within 25.0 s", "")

    result = check_torchrun(run, "linux", lambda: None, explain=explained())
    assert result.measured.startswith(
        "the launch of 2 ranks started but did not finish within 0 s; the load "
        "average is 16.0 on 2 cores: this machine is busy"
    )
    assert result.fix == BUSY


UNRESOLVABLE = "'doctor-test.invalid', which does not resolve ([Errno -2] unknown)"


def test_a_name_torchrun_cannot_meet_at_gets_local_addr_tried_and_printed():
    tried = []

    def run(env=None):
        tried.append(env)
        return "world_size=2 sum=3 threads=1\n"

    result = check_torchrun(run, "linux", lambda: UNRESOLVABLE)
    assert tried == [{"PET_LOCAL_ADDR": "127.0.0.1"}]  # not the run that would hang
    assert result.status == FAIL
    assert result.measured.startswith(
        f"--standalone cannot start here: its ranks meet at {UNRESOLVABLE}; with "
        "--local-addr=127.0.0.1 they did: world_size=2 sum=3 in "
    )
    assert result.fix == local_addr_fix("linux")


def test_the_printed_local_addr_fix_runs_torchrun_where_the_name_does_not_resolve(
    tmp_path,
):
    """The fix as printed, run in a shell whose torchrun takes an unresolvable
    name for this machine's (socket.getfqdn, where torchrun --standalone gets the
    address its ranks meet at)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import socket\nsocket.getfqdn = lambda name='': 'doctor-test.invalid'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    export = local_addr_fix("linux").split("`")[1]
    assert export == "export PET_LOCAL_ADDR=127.0.0.1"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = (
        f"{export}; {shlex.quote(sys.executable)} -c 'import socket; "
        "print(socket.getfqdn())'; "
        f"{shlex.quote(str(torchrun))} --standalone --nproc-per-node=2 -m "
        f"{launches.TORCHRUN_MODULE}"
    )
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=project_root(),
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    name, result = done.stdout.splitlines()[:2]
    assert name == "doctor-test.invalid"  # what torchrun's agent saw
    assert result.startswith(launches.TORCHRUN_EXPECTED)
