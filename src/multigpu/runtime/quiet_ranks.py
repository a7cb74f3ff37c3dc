"""How the ranks of a torchrun script stop together with one line (09, 11, 19).

Every rank checks the same options and stops with exit status 2; only rank 0 prints
the line. torchrun ends the other ranks as soon as one of them exits, so a quiet rank
that exited first could end rank 0 before its line was written (seen once on a busy
machine: torchrun's report, and no line). A quiet rank under torchrun therefore waits
before it exits: rank 0 prints and exits, and torchrun ends the quiet ranks.

Nothing here imports torch: the scripts stop before they import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import NoReturn

__all__ = ["QUIET_RANK_WAIT_S", "exit_quietly"]

QUIET_RANK_WAIT_S = 60.0  # then it exits anyway (rank 0 never stopped)


def exit_quietly(environ: Mapping[str, str] | None = None) -> NoReturn:
    """Exit with status 2 without a word; under torchrun, a rank other than 0 first
    waits up to QUIET_RANK_WAIT_S for torchrun to end it, once rank 0 has printed
    the run's one line and exited."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in environ and environ.get("RANK", "0") != "0":
        time.sleep(QUIET_RANK_WAIT_S)
    raise SystemExit(2)
