"""Whether :func:`~multigpu.horovod_api.init` was called in this process, and the
check every call makes (12)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from multigpu.horovod_api.errors import NotInitializedError


@dataclass
class _State:
    initialized: bool = False  # init() was called in this process
    owns_group: bool = False  # init() created the process group, shutdown() ends it


_state = _State()


def _require_init(call: str) -> None:
    """Raise if ``hvd.<call>()`` cannot run: no init(), or no process group."""
    if not _state.initialized:
        raise NotInitializedError(
            f"hvd.{call}() was called before hvd.init(), so there is no process "
            "group to ask. Call hvd.init() first, once at the start of the script "
            "(in a worker of multigpu.runtime.launch.spawn too)."
        )
    if not dist.is_initialized():
        raise NotInitializedError(
            f"hvd.{call}() was called after the process group was destroyed. Call "
            "hvd.init() again, or call it before hvd.shutdown()."
        )
