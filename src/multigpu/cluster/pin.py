"""The torch version this lesson's private APIs are taught on (20).

The fake process group (``torch/testing/_internal/distributed/fake_pg.py``), the
threaded one (``torch/testing/_internal/distributed/multi_threaded_pg.py``),
LocalTensor (``torch/distributed/_local_tensor/``) and the memory tracker
(``torch/distributed/_tools/fsdp2_mem_tracker.py``) are private: their names and
behaviour may change in any release. Every function of :mod:`multigpu.cluster`
that uses them calls :func:`check_torch_version` first, which refuses, in one
line, any other torch than :data:`TAUGHT_ON`.
"""

from __future__ import annotations

import torch

TAUGHT_ON = "2.14.1"  # the torch release notebook 20 was written and tested on


def check_torch_version(version: str | None = None) -> str:
    """Return the torch version (``version``, or the installed one) if its release
    is :data:`TAUGHT_ON`, else raise ``RuntimeError`` in one line (20)."""
    found = version if version is not None else torch.__version__
    release = found.split("+")[0]
    if release != TAUGHT_ON:
        raise RuntimeError(
            f"notebook 20 uses private torch APIs checked on torch {TAUGHT_ON}, "
            f"this is torch {found}; install torch=={TAUGHT_ON} (the course's "
            "constraints.txt pins it) to run it."
        )
    return found
