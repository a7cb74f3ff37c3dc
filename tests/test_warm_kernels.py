"""tests/warm_kernels.py: a kernel forked from the warm server starts as a new kernel
would (folder, arguments, path, environment, session, a rank's view), falls back to a
new kernel when its environment differs, takes Jupyter's interrupt, and dies with its
client."""

from __future__ import annotations

import json
import os
import signal
import time

import ipykernel.kernelspec
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from tests import warm_kernels

# What a kernel reports of itself, and what one of its ranks sees.
PROBE = """
import json, os, sys
from multigpu.runtime.launch import spawn
from multigpu.ranks.collectives import whoami_rank
skip = ("JPY_", "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
print(json.dumps({
    "cwd": os.getcwd(),
    "argv": [sys.argv[0], sys.argv[1]],  # then each kernel's own connection file
    "path": sys.path,
    "env": {k: v for k, v in os.environ.items() if not k.startswith(skip)},
    "own session": os.getsid(0) == os.getpid(),
    "main": sys.modules["__main__"].__name__,
    "ranks": spawn(whoami_rank, 2),
}))
"""


@pytest.fixture(scope="module")
def server():
    started = warm_kernels._Server()
    assert started.wait_ready()
    yield started
    started.stop()


def _argv(server=None) -> list[str]:
    argv = ipykernel.kernelspec.get_kernel_dict()["argv"]
    return warm_kernels.warm_argv(argv, server.address) if server else argv


class _Specs(KernelSpecManager):
    """ipykernel's kernel spec, started with the given command."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__()
        self._argv = argv

    def get_kernel_spec(self, kernel_name):
        spec = ipykernel.kernelspec.get_kernel_dict()
        spec["argv"] = self._argv
        return KernelSpec(resource_dir=ipykernel.kernelspec.RESOURCES, **spec)


class _Kernel:
    def __init__(self, argv: list[str], cwd) -> None:
        self.manager = KernelManager(kernel_spec_manager=_Specs(argv))
        self.manager.start_kernel(cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> tuple[str, str | None]:
        """What the code printed, and the name of the error it raised (or None)."""
        self.client.execute(code)
        return self.outcome(timeout)

    def outcome(self, timeout: float) -> tuple[str, str | None]:
        """What the running code printed, and the name of its error (or None)."""
        printed, error = "", None
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                printed += content["text"]
            elif kind == "error":
                error = content["ename"]
            elif kind == "status" and content["execution_state"] == "idle":
                if message["parent_header"].get("msg_type") == "execute_request":
                    return printed, error

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def _log(server) -> list[str]:
    with open(server.log) as log:
        return log.read().splitlines()


def test_a_warm_kernel_starts_as_a_new_kernel_would(server, tmp_path):
    reports = []
    for argv in (_argv(), _argv(server)):
        kernel = _Kernel(argv, tmp_path)
        try:
            printed, error = kernel.run(PROBE)
        finally:
            kernel.stop()
        assert error is None, printed
        reports.append(json.loads(printed))
    cold, warm = reports
    assert warm == cold
    assert cold["cwd"] == str(tmp_path) and cold["own session"]
    assert _log(server)[-1] == "warm"


def test_another_environment_starts_a_new_kernel(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIGPU_WARM_KERNELS_PROBE", "1")
    kernel = _Kernel(_argv(server), tmp_path)
    try:
        printed, error = kernel.run(
            "import os; print(os.environ['MULTIGPU_WARM_KERNELS_PROBE'])"
        )
    finally:
        kernel.stop()
    assert (printed, error) == ("1\n", None)
    assert _log(server)[-1] == "cold (environment: MULTIGPU_WARM_KERNELS_PROBE)"


def test_an_interrupt_reaches_the_warm_kernel_and_a_kill_ends_it(server, tmp_path):
    kernel = _Kernel(_argv(server), tmp_path)
    try:
        printed, _ = kernel.run("import os; print(os.getpid())")
        pid = int(printed)
        kernel.client.execute("import time; time.sleep(60)")
        time.sleep(1.0)
        started = time.monotonic()
        kernel.manager.interrupt_kernel()
        assert kernel.outcome(timeout=30)[1] == "KeyboardInterrupt"
        assert time.monotonic() - started < 30
        assert kernel.run("print('after')") == ("after\n", None)
        kernel.manager.signal_kernel(signal.SIGKILL)  # to the client's process group
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the warm kernel outlived its killed client")
    finally:
        kernel.client.stop_channels()
        kernel.manager.cleanup_resources()


def test_nbval_s_kernels_listen_on_unix_sockets_of_their_own(monkeypatch):
    """No TCP port that another process could take before the kernel binds it."""
    from nbval import kernel

    monkeypatch.setattr(kernel, "KernelManager", kernel.KernelManager)
    warm_kernels._unix_socket_kernels(kernel)
    name = kernel.CURRENT_ENV_KERNEL_NAME
    managers = [kernel.KernelManager(kernel_name=name) for _ in range(2)]
    for manager in managers:
        manager.write_connection_file()
    try:
        infos = [manager.get_connection_info() for manager in managers]
        assert {info["transport"] for info in infos} == {"ipc"}
        paths = [info["ip"] for info in infos]
        assert len(set(paths)) == 2 and all(len(p) < 90 for p in paths), paths
        manager, client = kernel.start_new_kernel(kernel_name=name)
        try:
            assert manager.transport == "ipc"
            reply = client.execute_interactive("x = 6 * 7", timeout=60)
            assert reply["content"]["status"] == "ok"
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    finally:
        for manager in managers:
            manager.cleanup_connection_file()
