"""The environment variables ranks on a laptop need, and the most threads a rank may
use (07, 09)."""

from __future__ import annotations

import os
from collections.abc import Mapping

# The most CPU threads one rank may use (threads=, OMP_NUM_THREADS): the machine's
# cores, and at least 8, so that a notebook asking for a few runs on any laptop;
# threads=10**6 would start a million threads in each rank.
MAX_THREADS = max(os.cpu_count() or 1, 8)


def laptop_environment(
    env: Mapping[str, str], platform: str, torchrun: bool = False
) -> dict[str, str]:
    """A copy of ``env`` with what laptops need for ranks on this machine, where
    the user has not set it (a value already in ``env`` is never changed):

    - macOS (``platform == "darwin"``): ``GLOO_SOCKET_IFNAME=lo0``. gloo otherwise
      looks up the machine's host name, which often fails on a laptop; every rank of
      :func:`spawn` and of ``torchrun --standalone`` is on 127.0.0.1, so the loopback
      interface is right.
    - Windows (``"win32"``), for torchrun only (``torchrun=True``): ``USE_LIBUV=0``,
      because PyTorch's Windows builds lack libuv and torchrun otherwise stops with
      "use_libuv was requested but PyTorch was built without libuv support".

    ``platform`` is a value of ``sys.platform``; any other platform gets ``env``
    unchanged."""
    env = dict(env)
    if platform == "darwin":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo0")
    if torchrun and platform == "win32":
        env.setdefault("USE_LIBUV", "0")
    return env
