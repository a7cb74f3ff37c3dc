"""The network the ranks use on one machine: the host names gloo and torchrun
resolve, the interface gloo may be told to use, a real connection to 127.0.0.1, free
ports and 29500, and USE_LIBUV on Windows."""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping

from multigpu.doctor.result import CheckResult, fail, ok, warn

DEFAULT_MASTER_PORT = 29500  # torchrun's --master-port when none is given
SLOW_RESOLUTION_S = 1.0  # a host-name lookup slower than this delays every rank
LOOPBACK = {"darwin": "lo0", "linux": "lo"}
CONNECT_TIMEOUT_S = 3.0  # the test connection to 127.0.0.1
# The errors of a connection to an interface that is down (no route to 127.0.0.1).
INTERFACE_DOWN = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}
# torchrun --standalone: where its ranks meet, unless --local-addr (PET_LOCAL_ADDR)
LOCAL_ADDR = "PET_LOCAL_ADDR"


def loopback_fix(platform: str = sys.platform) -> str:
    """How to make gloo use the loopback interface instead of the host name."""
    if platform == "win32":
        return "run the course in WSL 2 (docs/instructors.md, 'Windows: use WSL 2')"
    name = LOOPBACK.get(platform, "lo")
    return (
        f"export GLOO_SOCKET_IFNAME={name} in the terminal before torchrun or "
        "python (add it to your shell profile)"
    )


def export_command(assignments: Mapping[str, str], platform: str) -> str:
    """The shell line that sets ``assignments``: ``export A=1 B=2`` (PowerShell's
    ``$env:A = '1'; ...`` on Windows)."""
    if platform == "win32":
        return "; ".join(
            f"$env:{name} = '{value}'" for name, value in assignments.items()
        )
    return "export " + " ".join(
        f"{name}={value}" for name, value in assignments.items()
    )


def local_addr_fix(platform: str = sys.platform) -> str:
    """How to make torchrun --standalone meet on 127.0.0.1 instead of at the host
    name, in a terminal and in the notebooks (PET_LOCAL_ADDR is --local-addr)."""
    return (
        f"`{export_command({LOCAL_ADDR: '127.0.0.1'}, platform)}` (torchrun's "
        "--local-addr=127.0.0.1, for every torchrun started from that shell, the "
        "notebooks' too) in the terminal before `make lab` or torchrun, and in "
        "your shell profile"
    )


def torchrun_name_problem(
    env: Mapping[str, str] = os.environ, getfqdn: Callable[[], str] | None = None
) -> str | None:
    """What is wrong with the address torchrun --standalone tells its ranks to meet
    at (``--local-addr``, else this machine's fully qualified name, as
    torch.distributed.elastic's rendezvous takes it), None if nothing is: it does
    not resolve, or to no address of this machine."""
    name = env.get(LOCAL_ADDR) or (getfqdn or socket.getfqdn)()
    try:
        if bindable_address(name) is not None:
            return None
    except OSError as exc:  # socket.gaierror
        return f"{name!r}, which does not resolve ({exc})"
    return f"{name!r}, which resolves to no address of this machine"


def bindable_address(host: str) -> str | None:
    """The first address ``host`` resolves to that this machine can bind, as gloo
    chooses its address; None if none binds. Raises socket.gaierror (OSError) when
    the name does not resolve."""
    for family, kind, proto, _, address in socket.getaddrinfo(
        host, None, type=socket.SOCK_STREAM
    ):
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((address[0], 0))
            except OSError:
                continue
        return address[0]
    return None


def interface_names() -> list[str]:
    """The network interfaces of this machine (``lo``, ``eth0``, ...)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def check_host_name(
    platform: str = sys.platform,
    env: Mapping[str, str] = os.environ,
    host: str | None = None,
    interfaces: Callable[[], list[str]] = interface_names,
    torchrun_problem: Callable[[], str | None] | None = None,
) -> CheckResult:
    """torchrun --standalone's ranks meet at this machine's name
    (:func:`torchrun_name_problem`); gloo finds its address from the host name
    unless GLOO_SOCKET_IFNAME names an interface: each name resolves to an address
    this machine can bind, quickly."""
    chosen = env.get("GLOO_SOCKET_IFNAME", "")
    if chosen:
        known = interfaces()
        unknown = [name for name in chosen.split(",") if name not in known]
        if unknown:
            name = LOOPBACK.get(platform, "lo")
            return fail(
                "host name",
                f"GLOO_SOCKET_IFNAME={chosen} names no interface of this machine "
                f"({', '.join(known) or 'none found'}): gloo cannot start",
                f"unset GLOO_SOCKET_IFNAME, or set it to {name}",
            )
    meeting = torchrun_problem() if torchrun_problem else torchrun_name_problem(env)
    if meeting is not None:
        return fail(
            "host name",
            f"torchrun --standalone tells its ranks to meet at {meeting}: its jobs "
            "cannot start (the notebooks' torchrun ones too)",
            local_addr_fix(platform),
        )
    host = socket.gethostname() if host is None else host
    start = time.monotonic()
    try:
        address = bindable_address(host)
    except OSError as exc:  # socket.gaierror: the name does not resolve
        address, problem = None, f"{host!r} does not resolve ({exc})"
    else:
        problem = f"{host!r} resolves to no address this machine can bind"
    seconds = time.monotonic() - start
    if chosen:
        found = f"{host} -> {address}" if address else problem
        return ok(
            "host name", f"GLOO_SOCKET_IFNAME={chosen}: gloo binds there ({found})"
        )
    if address is None:
        launchers = (
            "the notebooks' launchers set GLOO_SOCKET_IFNAME=lo0 themselves"
            if platform == "darwin"
            else "gloo falls back to 127.0.0.1 with a warning"
        )
        return warn("host name", f"{problem}: {launchers}", loopback_fix(platform))
    measured = f"{host} -> {address} in {seconds:.2f} s"
    if seconds > SLOW_RESOLUTION_S:
        return warn(
            "host name",
            f"{measured}: slow, and every gloo rank waits for it",
            loopback_fix(platform),
        )
    return ok("host name", measured)


def listen_error(port: int, host: str) -> OSError | None:
    """The error of binding a TCP port as torch's store does; None if it binds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if sys.platform != "win32":  # as the store: a closed port's TIME_WAIT is no use
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def port_holder(port: int) -> str:
    """``" (pid 123, python3)"``: who listens on ``port``, where psutil can say."""
    try:
        import psutil

        for connection in psutil.net_connections("tcp"):
            if connection.laddr and connection.laddr.port == port and connection.pid:
                name = psutil.Process(connection.pid).name()
                return f" (pid {connection.pid}, {name})"
    except Exception:  # no psutil, or not allowed to list connections (macOS)
        pass
    return ""


def free_port() -> int:
    """A port the operating system hands out (port 0), as the launchers ask."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def loopback_error(timeout: float = CONNECT_TIMEOUT_S) -> OSError | None:
    """The error of a TCP connection to a port listening on 127.0.0.1, as every
    rank makes to the store; None if it connects and a byte goes through."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            server.settimeout(timeout)
            address = server.getsockname()
            with socket.create_connection(address, timeout=timeout) as client:
                accepted, _ = server.accept()
                with accepted:
                    accepted.settimeout(timeout)
                    client.sendall(b"x")
                    if accepted.recv(1) != b"x":
                        return ConnectionError("the byte sent did not arrive")
    except OSError as exc:  # TimeoutError, ConnectionRefusedError, ...
        return exc
    return None


def loopback_up_fix(error: OSError, platform: str = sys.platform) -> str:
    """What makes 127.0.0.1 connect: the loopback interface up where the error says
    it is down, else the firewall."""
    if error.errno in INTERFACE_DOWN and platform in LOOPBACK:
        name = LOOPBACK[platform]
        command = "ip link set lo up" if platform == "linux" else "ifconfig lo0 up"
        return f"bring the loopback interface {name} up: `sudo {command}`"
    return "let Python connect to 127.0.0.1 in your firewall or security software"


def check_ports(
    port: int = DEFAULT_MASTER_PORT,
    get_free_port: Callable[[], int] = free_port,
    connect: Callable[[], OSError | None] = loopback_error,
    platform: str = sys.platform,
) -> CheckResult:
    """A connection to a port listening on 127.0.0.1 goes through, as every rank's
    does; the launchers get a free port from the system; ``port`` (torchrun's
    default 29500) is free too, or only commands typed in a terminal are affected."""
    try:
        free = get_free_port()
    except OSError as exc:
        return fail(
            "ports",
            f"cannot open a TCP port on 127.0.0.1 ({exc})",
            "let Python listen on 127.0.0.1 in your firewall or security software",
        )
    refused = connect()
    if refused is not None:
        return fail(
            "ports",
            f"nothing can connect to 127.0.0.1: a connection to a listening port "
            f"failed ({refused}), and every rank connects there",
            loopback_up_fix(refused, platform),
        )
    taken = listen_error(port, "127.0.0.1") or listen_error(port, "")
    if taken is None:
        return ok(
            "ports",
            f"the system hands out free ports (e.g. {free}), as spawn and torchrun "
            f"--standalone ask; {port}, torchrun's default, is free too",
        )
    return warn(
        "ports",
        f"{port} is in use{port_holder(port)}: the notebooks are not affected "
        f"(spawn and torchrun --standalone take a free port, e.g. {free})",
        f"in a terminal, use `torchrun --standalone`, or "
        f"`--master-port` with another port than {port}",
    )


def libuv_supported() -> bool:
    """Whether this PyTorch's TCPStore has the libuv backend torchrun asks for."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True
        )
    except Exception:  # "use_libuv was requested but PyTorch was built without..."
        return False
    return bool(getattr(store, "libuvBackend", True))


def check_libuv(
    platform: str = sys.platform,
    env: Mapping[str, str] = os.environ,
    supported: Callable[[], bool] = libuv_supported,
) -> CheckResult | None:
    """Windows only (None elsewhere): torchrun's store uses libuv unless
    USE_LIBUV=0, and PyTorch's Windows builds lack it."""
    if platform != "win32":
        return None
    if env.get("USE_LIBUV") == "0":
        return ok("USE_LIBUV", "USE_LIBUV=0: torchrun's store does not need libuv")
    if supported():
        return ok("USE_LIBUV", "this PyTorch has libuv: torchrun needs no USE_LIBUV")
    return warn(
        "USE_LIBUV",
        "this PyTorch has no libuv and USE_LIBUV is not 0: torchrun in a terminal "
        "stops with 'use_libuv was requested but PyTorch was built without libuv "
        "support' (the notebooks' torchrun sets USE_LIBUV=0 itself)",
        "`set USE_LIBUV=0` (cmd) or `$env:USE_LIBUV = '0'` (PowerShell) before "
        "torchrun, or use WSL 2",
    )
