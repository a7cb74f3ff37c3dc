"""Support code that starts worker processes for notebooks 07-11: you may skip it.

Nothing here is about data parallelism. In a script you would use PyTorch's own
launchers; this package stands in for them where they do not fit a notebook:

- :func:`spawn` (like ``torch.multiprocessing.spawn``) starts ``world_size``
  processes, joins them into a process group, hands back each rank's return value
  in rank order, and turns a rank that raises, dies or never joins into one clear
  error within seconds (:class:`WorkerError`, :class:`DeadlineExceededError`).
- :func:`run_torchrun` runs ``torchrun --standalone --nproc-per-node=N -m module``
  as a subprocess and returns what it printed; :func:`start_torchrun` and
  :func:`stop_torchrun` run one without waiting; a torchrun script ends with
  :func:`exit_rank`.

``notebooks/07_collectives_from_scratch.ipynb`` shows how to use it; the functions
the ranks run live in :mod:`multigpu.ranks`. The exact contract (timeouts,
deadlines, errors, what happens when the caller dies) is in ``docs/launch.md``.
Files: ``errors`` (the exceptions), ``parent`` (spawn), ``_child`` (what runs in
each rank), ``_diagnosis`` (from what the parent saw to one error), ``_stderr``,
``_watchdog`` (kills the ranks when the caller dies), ``_start`` (each rank's
start, bounded by the deadline), ``timeouts`` (timeout: each collective;
deadline: the whole run; their defaults, named once), ``environment``,
``rank_functions`` (check_importable, in_one_launch), ``torchrun`` and
``_process_tree`` (what a rank or torchrun started, and how to end it).

This package imports torch lazily, so that with "spawn" a child sets its thread
limits before torch loads.
"""

from multigpu.runtime.launch._child import HOST
from multigpu.runtime.launch.environment import MAX_THREADS, laptop_environment
from multigpu.runtime.launch.errors import (
    DeadlineExceededError,
    RemoteTraceback,
    TorchrunError,
    WorkerError,
    WorkerNotImportableError,
)
from multigpu.runtime.launch.parent import (
    MAX_RANKS,
    RANKS_PER_CORE,
    START_METHOD,
    max_ranks,
    spawn,
)
from multigpu.runtime.launch.rank_functions import check_importable, in_one_launch
from multigpu.runtime.launch.timeouts import (
    CROWDED_TIMEOUT_S,
    DEFAULT_DEADLINE_S,
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
    NO_TIMEOUT,
    QUICK_TIMEOUT_S,
    RESTARTS_DEADLINE_S,
    SLOW_TIMEOUT_S,
    TORCHRUN_DEADLINE_S,
    as_timedelta,
    deadline_not_timeout,
    is_communication_error,
    is_timeout,
)
from multigpu.runtime.launch.torchrun import (
    exit_rank,
    run_torchrun,
    start_torchrun,
    stop_torchrun,
)

__all__ = [
    "CROWDED_TIMEOUT_S",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_TIMEOUT_S",
    "HOST",
    "MAX_RANKS",
    "MAX_THREADS",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "NO_TIMEOUT",
    "QUICK_TIMEOUT_S",
    "RANKS_PER_CORE",
    "RESTARTS_DEADLINE_S",
    "SLOW_TIMEOUT_S",
    "START_METHOD",
    "TORCHRUN_DEADLINE_S",
    "DeadlineExceededError",
    "RemoteTraceback",
    "TorchrunError",
    "WorkerError",
    "WorkerNotImportableError",
    "as_timedelta",
    "check_importable",
    "deadline_not_timeout",
    "exit_rank",
    "in_one_launch",
    "is_communication_error",
    "is_timeout",
    "laptop_environment",
    "max_ranks",
    "run_torchrun",
    "spawn",
    "start_torchrun",
    "stop_torchrun",
]
