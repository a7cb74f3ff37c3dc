"""Host name, ports and USE_LIBUV, each failure simulated."""

import errno
import os
import shutil
import socket
import subprocess
import sys

import pytest

from multigpu.doctor import network
from multigpu.doctor.network import (
    check_host_name,
    check_libuv,
    check_ports,
    interface_names,
    libuv_supported,
    listen_error,
    local_addr_fix,
    loopback_error,
    torchrun_name_problem,
)
from multigpu.doctor.result import FAIL, OK, WARN

LINUX_FIX = (
    "export GLOO_SOCKET_IFNAME=lo in the terminal before torchrun or python "
    "(add it to your shell profile)"
)
MACOS_FIX = (
    "export GLOO_SOCKET_IFNAME=lo0 in the terminal before torchrun or python "
    "(add it to your shell profile)"
)
WINDOWS_FIX = "run the course in WSL 2 (docs/instructors.md, 'Windows: use WSL 2')"


@pytest.fixture
def unresolvable(monkeypatch):
    """This machine's name does not resolve (a macOS ``.local`` name): name
    resolution fails, and the fully qualified name is the bare name."""

    def getaddrinfo(host, *args, **kwargs):
        if host in ("127.0.0.1", "localhost"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        raise socket.gaierror(8, "nodename nor servname provided, or not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "MacBook-Pro.local")


def torchrun_fine():
    """torchrun's ranks meet at a name that resolves here (only gloo's does not)."""
    return None


@pytest.mark.parametrize("platform", ["darwin", "linux", "win32"])
def test_a_host_name_that_does_not_resolve_fails_with_torchruns_local_addr(
    unresolvable, platform
):
    result = check_host_name(platform, env={}, host="MacBook-Pro.local")
    assert result.status == FAIL
    assert result.measured == (
        "torchrun --standalone tells its ranks to meet at 'MacBook-Pro.local', which "
        "does not resolve ([Errno 8] nodename nor servname provided, or not known): "
        "its jobs cannot start (the notebooks' torchrun ones too)"
    )
    assert result.fix == local_addr_fix(platform)
    assert "GLOO_SOCKET_IFNAME" not in result.fix  # no help to torchrun
    export = "export PET_LOCAL_ADDR=127.0.0.1"
    if platform == "win32":
        export = "$env:PET_LOCAL_ADDR = '127.0.0.1'"
    assert result.fix.startswith(f"`{export}` (torchrun's --local-addr=127.0.0.1")
    # with the fix set, torchrun's name no longer matters; gloo's still warns
    done = check_host_name(platform, {"PET_LOCAL_ADDR": "127.0.0.1"}, "box")
    assert done.status == WARN
    assert done.measured.startswith("'box' does not resolve")


def test_torchrun_meets_at_the_fully_qualified_name_or_its_local_addr(monkeypatch):
    def far_away(*args, **kwargs):  # TEST-NET-3: no interface of ours has it
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("203.0.113.7", 0))]

    assert torchrun_name_problem({}, lambda: "localhost") is None
    monkeypatch.setattr(socket, "getaddrinfo", far_away)
    assert torchrun_name_problem({}, lambda: "box.example") == (
        "'box.example', which resolves to no address of this machine"
    )
    assert torchrun_name_problem({"PET_LOCAL_ADDR": "10.9.9.9"}) == (
        "'10.9.9.9', which resolves to no address of this machine"
    )


@pytest.mark.parametrize(
    "platform, fix",
    [("darwin", MACOS_FIX), ("linux", LINUX_FIX), ("win32", WINDOWS_FIX)],
)
def test_a_gloo_host_name_that_does_not_resolve_warns_with_gloo_socket_ifname(
    unresolvable, platform, fix
):
    result = check_host_name(
        platform, env={}, host="MacBook-Pro.local", torchrun_problem=torchrun_fine
    )
    assert result.status == WARN
    assert result.measured.startswith(
        "'MacBook-Pro.local' does not resolve ([Errno 8] nodename nor servname"
    )
    assert result.fix == fix


def test_on_macos_the_warning_says_the_notebooks_set_it_themselves(unresolvable):
    result = check_host_name(
        "darwin", env={}, host="mac.local", torchrun_problem=torchrun_fine
    )
    assert result.measured.endswith(
        ": the notebooks' launchers set GLOO_SOCKET_IFNAME=lo0 themselves"
    )
    result = check_host_name("linux", {}, "box", torchrun_problem=torchrun_fine)
    assert result.measured.endswith(": gloo falls back to 127.0.0.1 with a warning")


def test_gloo_socket_ifname_set_to_an_interface_makes_the_name_irrelevant(
    unresolvable,
):
    env = {"GLOO_SOCKET_IFNAME": "lo", "PET_LOCAL_ADDR": "127.0.0.1"}
    result = check_host_name("linux", env=env, host="box")
    assert result.status == OK
    assert result.measured.startswith("GLOO_SOCKET_IFNAME=lo: gloo binds there ('box'")


def test_gloo_socket_ifname_naming_no_interface_fails():
    result = check_host_name(
        "darwin", env={"GLOO_SOCKET_IFNAME": "en9"}, interfaces=lambda: ["lo0", "en0"]
    )
    assert result.status == FAIL
    assert result.measured == (
        "GLOO_SOCKET_IFNAME=en9 names no interface of this machine (lo0, en0): "
        "gloo cannot start"
    )
    assert result.fix == "unset GLOO_SOCKET_IFNAME, or set it to lo0"


def test_a_name_that_resolves_to_another_machine_warns(monkeypatch):
    def getaddrinfo(*args, **kwargs):  # TEST-NET-3: no interface of ours has it
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("203.0.113.7", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    result = check_host_name("linux", {}, "box", torchrun_problem=torchrun_fine)
    assert result.status == WARN
    assert result.measured.startswith(
        "'box' resolves to no address this machine can bind"
    )
    assert result.fix == LINUX_FIX


def test_a_slow_resolution_warns_and_a_quick_one_passes(monkeypatch):
    assert check_host_name("linux", env={}, host="localhost").status == OK
    assert check_host_name(env={}).status in (OK, WARN)  # this machine's name
    monkeypatch.setattr(network, "SLOW_RESOLUTION_S", -1.0)
    result = check_host_name("linux", env={}, host="localhost")
    assert result.status == WARN
    assert result.measured.endswith(": slow, and every gloo rank waits for it")
    assert result.fix == LINUX_FIX


def test_this_machine_has_a_loopback_interface():
    assert any(name.startswith("lo") for name in interface_names())


def test_a_held_port_warns_that_only_terminal_commands_are_affected():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert listen_error(port, "") is not None
        result = check_ports(port)
    assert result.status == WARN
    assert result.measured.startswith(f"{port} is in use (pid {os.getpid()}, ")
    assert "the notebooks are not affected (spawn and torchrun --standalone" in (
        result.measured
    )
    assert result.fix == (
        f"in a terminal, use `torchrun --standalone`, or `--master-port` with "
        f"another port than {port}"
    )
    assert check_ports(port).status == OK  # released


def test_port_29500_held():
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 29500))
        except OSError:
            pytest.skip("29500 is held by another program: the test above covers it")
        holder.listen()
        result = check_ports()
    assert result.status == WARN
    assert result.measured.startswith("29500 is in use")


def test_no_free_port_at_all_fails():
    def refused():
        raise PermissionError(13, "Permission denied")

    result = check_ports(get_free_port=refused)
    assert result.status == FAIL
    assert result.measured == (
        "cannot open a TCP port on 127.0.0.1 ([Errno 13] Permission denied)"
    )
    assert result.fix == (
        "let Python listen on 127.0.0.1 in your firewall or security software"
    )


@pytest.mark.parametrize(
    "platform, command", [("linux", "ip link set lo up"), ("darwin", "ifconfig lo0 up")]
)
def test_a_loopback_interface_that_is_down_fails_ports_with_how_to_bring_it_up(
    platform, command
):
    def down():  # what a connection to 127.0.0.1 gets when lo is down
        return OSError(errno.ENETUNREACH, "Network is unreachable")

    result = check_ports(connect=down, platform=platform)
    assert result.status == FAIL
    assert result.measured == (
        "nothing can connect to 127.0.0.1: a connection to a listening port failed "
        "([Errno 101] Network is unreachable), and every rank connects there"
    )
    name = command.split()[-2] if platform == "darwin" else "lo"
    assert result.fix == f"bring the loopback interface {name} up: `sudo {command}`"


def test_a_firewall_that_drops_connections_to_127_0_0_1_fails_ports():
    result = check_ports(connect=lambda: TimeoutError("timed out"), platform="linux")
    assert result.status == FAIL
    assert "(timed out)" in result.measured
    assert result.fix == (
        "let Python connect to 127.0.0.1 in your firewall or security software"
    )


def test_here_a_byte_goes_through_a_connection_to_127_0_0_1():
    assert loopback_error() is None


@pytest.mark.skipif(
    not (shutil.which("unshare") and shutil.which("ip")),
    reason="needs util-linux's unshare and iproute2's ip",
)
def test_the_printed_fix_brings_a_loopback_that_is_really_down_up(tmp_path):
    """In a network namespace of its own (its loopback starts down; nothing of this
    machine changes), the check fails, the command it prints is run (as root of
    the namespace: no sudo), and the check passes."""
    check = (
        f"{sys.executable} -c 'from multigpu.doctor.network import check_ports; "
        "r = check_ports(); print(r.status); print(r.fix)'"
    )
    script = tmp_path / "fix.sh"
    script.write_text(
        f"{check} > before.txt\n"
        "sh -c \"$(sed -n 's/.*`sudo \\(.*\\)`.*/\\1/p' before.txt)\"\n"
        f"{check}\n"
    )
    done = subprocess.run(
        ["unshare", "--map-root-user", "--net", "sh", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if not (tmp_path / "before.txt").exists():  # not allowed here (containers)
        pytest.skip(f"no network namespace here: {done.stderr.strip()}")
    before = (tmp_path / "before.txt").read_text().splitlines()
    assert before == [
        FAIL,
        "bring the loopback interface lo up: `sudo ip link set lo up`",
    ]
    assert done.stdout.splitlines()[0] == OK, done.stdout + done.stderr


def test_use_libuv_is_reported_on_windows_only():
    assert check_libuv("linux", env={}, supported=lambda: False) is None
    assert check_libuv("darwin", env={}) is None
    result = check_libuv("win32", env={}, supported=lambda: False)
    assert result.status == WARN
    assert "stops with 'use_libuv was requested but PyTorch was built" in (
        result.measured
    )
    assert result.fix == (
        "`set USE_LIBUV=0` (cmd) or `$env:USE_LIBUV = '0'` (PowerShell) before "
        "torchrun, or use WSL 2"
    )
    assert check_libuv("win32", {"USE_LIBUV": "0"}, lambda: False).status == OK
    assert check_libuv("win32", env={}, supported=lambda: True).status == OK


def test_this_pytorch_has_libuv_on_linux():
    if os.name == "nt":
        pytest.skip("PyTorch's Windows builds lack libuv")
    assert libuv_supported() is True
