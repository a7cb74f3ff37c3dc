"""A pytest plugin for nbval: each notebook's kernel is forked from a process that
has already imported torch, instead of a new Python that imports it again.

`make test` starts about 115 kernels (every notebook natively, the lessons again
without CPU kernels); each new one spent about 3 processor-seconds importing torch,
torch._dynamo (which the first optimizer step imports) and ipykernel before its first
cell ran. Here one server process per pytest run imports them once, then forks a
kernel for each notebook; the kernel runs ipykernel exactly as ``python -m
ipykernel_launcher`` would, in its own session, with the folder, environment,
``sys.argv`` and ``sys.path`` a new kernel gets (tests/test_warm_kernels.py compares
them with a new kernel's). The notebook's code, and every process it starts, run as
before; only the imports are done once. Stored outputs are written by new kernels
(`make notebooks`) and compared here, so a difference shows as a failure.

A kernel is forked only when its environment equals the server's (but for the
variables Jupyter adds); otherwise, or when the server is not there, the kernel
starts the usual way. ``MULTIGPU_COLD_KERNELS=1`` starts every kernel the usual way::

    python -m pytest -p tests.warm_kernels --nbval ... NOTEBOOKS

The kernel's manager talks to a small client (this file, run with ``-I -S``), which
passes its standard streams to the server, forwards the signals Jupyter sends
(interrupt, terminate) to the kernel's process group, and exits with the kernel's
exit status. Killing the client kills the kernel's process group, as Jupyter's kill
would. Every nbval kernel, forked or new, listens on Unix sockets of its own rather
than on TCP ports (``_unix_socket_kernels``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

# Imported once by the server; together about 3 processor-seconds per kernel.
# matplotlib is left out: it reads MPLBACKEND when imported, which ipykernel sets.
# The launcher's module too, and what its forkserver preloads (FORKSERVER_PRELOAD).
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "numpy",
    "ipykernel.kernelapp",
    "multigpu.runtime.launch.parent",
)
# Variables the kernel's manager adds to the environment it starts a kernel with, and
# the one pytest sets for each test; the kernel gets the values it is sent.
ADDED_BY_JUPYTER = ("JPY_", "PYDEVD_", "PYTEST_CURRENT_TEST")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED += (signal.SIGUSR1, signal.SIGUSR2)
_HEADER = 8  # bytes of the request's length
_READY_S = 120.0  # how long the first kernel waits for the server's imports
_POLL_S = 0.1


# ---------------------------------------------------------------- the client


def _cold(argv: list[str]) -> None:
    """Become a kernel started the usual way."""
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def client(address: str, argv: list[str]) -> None:
    """Ask the server at ``address`` for a kernel with ``argv`` (``-f FILE``), then
    stand for it until it exits."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address)
        request = json.dumps(
            {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        ).encode()
        socket.send_fds(
            conn, [len(request).to_bytes(_HEADER, "big") + request], [0, 1, 2]
        )
        reply = conn.makefile("r")
        first = reply.readline().split()
    except OSError:
        first = []
    if len(first) != 2 or first[0] != "pid":
        _cold(argv)
    pid = int(first[1])

    def forward(signum, _frame):
        _signal_group(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    for line in reply:
        words = line.split()
        if len(words) == 2 and words[0] == "exit":
            sys.exit(int(words[1]))
    sys.exit(1)


# ---------------------------------------------------------------- the server


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _address = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < _HEADER:
        raise OSError("short request")
    size = int.from_bytes(data[:_HEADER], "big")
    body = data[_HEADER:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise OSError("short request")
        body += more
    return json.loads(body), list(fds)


def _differences(env: dict[str, str], own: dict[str, str]) -> list[str]:
    names = set(env) | set(own)
    return sorted(
        name
        for name in names
        if not name.startswith(ADDED_BY_JUPYTER) and env.get(name) != own.get(name)
    )


def _threads() -> int:
    """The threads of this process; importing torch starts one, as it does in the
    forkserver the course's launcher forks its ranks from."""
    return len(os.listdir("/proc/self/task"))


def _become_kernel(
    request: dict, imported: dict[str, str], fds: list[int], keep_closed: list
) -> None:
    """In the forked child: set up what ``python -m ipykernel_launcher`` starts with
    (``imported``: the variables the server's imports set), run the kernel, and exit
    as that Python would. Never returns."""
    code = 1
    try:
        os.setsid()
        for item in keep_closed:
            item.close()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for name, value in imported.items():  # as those imports set them
            os.environ.setdefault(name, value)
        import ipykernel_launcher

        sys.argv = [ipykernel_launcher.__file__, *request["argv"]]
        del sys.path[0]  # this file's folder; ipykernel_launcher drops `-m`'s ""
        if "numpy" in sys.modules:  # a new Python seeds it from the system
            sys.modules["numpy"].random.seed()
        _start_forkserver()
        from ipykernel import kernelapp

        try:
            kernelapp.launch_new_instance()
            code = 0
        except SystemExit as ended:
            code = (
                ended.code if isinstance(ended.code, int) else (ended.code is not None)
            )
        import atexit
        import threading

        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


_log_path = os.devnull


def _start_forkserver() -> None:
    """Start, as a fork of this process, the forkserver that the course's launcher
    would start on its first launch (a new Python importing FORKSERVER_PRELOAD, each
    already imported here); multiprocessing then finds it running. Its ranks get the
    caller's folder, path, arguments and environment as from any forkserver.

    It freezes what it inherits (``gc.freeze``) before it forks a rank. Forked from
    the kernel, it inherits the kernel's garbage collector as it stands: without the
    freeze, 60 of the 202 ranks of lessons 08, 13, 14b, 15, 16 and 19 ran a full
    collection, walking the 300,000 objects they share with the forkserver (and,
    writing to their headers, copying its pages) at about half a processor-second
    each; the ranks of a new forkserver, as JupyterLab's kernels start, cost the same
    with a freeze and without. Those six lessons under nbval, all processes
    together: 89 processor-seconds without the freeze, 73 with it."""
    import gc
    import types
    from multiprocessing import connection, forkserver

    from multigpu.runtime.launch import parent

    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(alive_w)
            sys.modules["__main__"] = types.ModuleType("__main__")  # as under -c
            gc.freeze()
            forkserver.main(listener.fileno(), alive_r, parent.FORKSERVER_PRELOAD)
        finally:
            os._exit(0)
    os.close(alive_r)
    listener.close()
    server = forkserver._forkserver
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def serve(address: str, log: str) -> None:
    """Import PRELOAD, then fork a kernel for each client until standard input
    closes (the pytest run that started this server has ended); one line for each
    kernel in ``log``."""
    import importlib

    global _log_path
    _log_path = log
    own = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in sys.modules["multigpu.runtime.launch.parent"].FORKSERVER_PRELOAD:
        importlib.import_module(name)
    # torch._dynamo sets TORCHINDUCTOR_CACHE_DIR as it is imported
    imported = {name: value for name, value in os.environ.items() if name not in own}
    threads = _threads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    print("ready", flush=True)
    kernels: dict[socket.socket, int] = {}
    try:
        while True:
            readable, _, _ = select.select(
                [listener, sys.stdin, *kernels], [], [], _POLL_S
            )
            _reap(kernels)
            for item in readable:
                if item is sys.stdin:
                    if not os.read(0, 1024):
                        return
                elif item is listener:
                    _start(listener, kernels, own, imported, threads)
                elif not item.recv(1024) and item in kernels:  # the client is gone
                    _signal_group(kernels.pop(item))
                    item.close()
    finally:
        for conn, pid in kernels.items():
            _signal_group(pid)
            conn.close()
        listener.close()


def _start(
    listener: socket.socket, kernels: dict, own: dict, imported: dict, threads: int
) -> None:
    """Fork a kernel for the client at the listener, or tell it to start cold: when
    its environment differs from this server's, or a thread was started here since
    the imports (a fork copies only the thread that forks; the one importing torch
    starts ends soon after)."""
    conn, _ = listener.accept()
    try:
        request, fds = _receive(conn)
    except (OSError, ValueError):
        conn.close()
        return
    differences = _differences(request["env"], own)
    if differences or _threads() > threads or len(fds) != 3:
        reason = f"environment: {', '.join(differences)}" if differences else "threads"
        conn.sendall(f"cold {reason}\n".encode())
        conn.close()
        _log(f"cold ({reason})")
    else:
        pid = os.fork()
        if pid == 0:
            _become_kernel(request, imported, fds, [listener, conn, *kernels])
        kernels[conn] = pid
        conn.sendall(f"pid {pid}\n".encode())
        _log("warm")
    for fd in fds:
        os.close(fd)


def _log(line: str) -> None:
    """One line per kernel in the server's log, which the run's summary counts."""
    with open(_log_path, "a") as log:
        log.write(line + "\n")


def _reap(kernels: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for conn, kernel in list(kernels.items()):
            if kernel == pid:
                del kernels[conn]
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def _signal_group(pid: int, signum: int = signal.SIGKILL) -> None:
    """``signum`` to the kernel's process group, or to the kernel alone before it
    has made its own session."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signum)
            return
        except OSError:
            pass


# ---------------------------------------------------------------- the plugin


class _Server:
    """The server of one pytest run, started at configure time."""

    def __init__(self) -> None:
        import subprocess
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="warm-kernels-")
        self.address = os.path.join(self.folder, "server")
        self.log = os.path.join(self.folder, "log")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "serve", self.address, self.log],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # os.environ, as Jupyter gives a kernel: the process's own environment
            # can hold more (LINES and COLUMNS, set by a C library under pytest)
            env=dict(os.environ),
        )
        self.ready: bool | None = None

    def wait_ready(self) -> bool:
        if self.ready is None:
            seen, _, _ = select.select([self.process.stdout], [], [], _READY_S)
            self.ready = (
                bool(seen) and self.process.stdout.readline().strip() == "ready"
            )
        return self.ready

    def stop(self) -> None:
        import shutil
        import subprocess

        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_server: _Server | None = None


def warm_argv(argv: list[str], address: str) -> list[str]:
    """A kernel spec's ``python -m ipykernel_launcher -f FILE`` as this file's client
    of the server at ``address``."""
    at = argv.index("ipykernel_launcher")
    return [argv[0], "-I", "-S", __file__, "client", address, *argv[at + 1 :]]


def _unix_socket_kernels(kernel) -> None:
    """nbval's kernels, forked or new, listen on Unix sockets instead of TCP ports.

    Jupyter picks a kernel's five ports as free ports, closes them, and the kernel
    binds them a moment later; meanwhile the other parts of `make test` open ports
    all the time (each launch's store and gloo's connections), and a kernel whose
    port was taken dies before its first cell ("Kernel died before replying to
    kernel_info"), which once failed a whole notebook. A Unix socket's name is the
    kernel's own, so nothing else can take it."""
    import tempfile
    import uuid

    from jupyter_client.manager import KernelManager
    from traitlets import CaselessStrEnum

    class UnixSocketKernelManager(KernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        def _ip_default(self) -> str:  # short: a socket's path has at most 107 bytes
            if self.transport != "ipc":
                return super()._ip_default()
            name = f"nbval-kernel-{uuid.uuid4().hex[:12]}"
            return os.path.join(tempfile.gettempdir(), name)

    kernel.KernelManager = UnixSocketKernelManager


def pytest_configure(config) -> None:
    if not config.getoption("nbval", default=False):
        return
    from nbval import kernel

    _unix_socket_kernels(kernel)
    if os.environ.get("MULTIGPU_COLD_KERNELS") == "1":
        return

    cold_spec = kernel.NbvalKernelspecManager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):
        global _server
        spec = cold_spec(self, kernel_name)
        if kernel_name != kernel.CURRENT_ENV_KERNEL_NAME:
            return spec
        if _server is None:  # started here, with the environment kernels get
            _server = _Server()
        if _server.wait_ready():
            spec.argv = warm_argv(spec.argv, _server.address)
        return spec

    kernel.NbvalKernelspecManager.get_kernel_spec = get_kernel_spec


def pytest_terminal_summary(terminalreporter) -> None:
    if _server is None:
        return
    try:
        with open(_server.log) as log:
            lines = log.read().splitlines()
    except FileNotFoundError:
        lines = []
    warm = lines.count("warm")
    cold = sorted(set(line for line in lines if line != "warm"))
    said = f"kernels forked from the warm server: {warm} of {len(lines)}"
    terminalreporter.write_line(said + "".join(f"; {line}" for line in cold))


def pytest_unconfigure(config) -> None:
    global _server
    if _server is not None:
        _server.stop()
        _server = None


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        client(sys.argv[2], sys.argv[3:])
