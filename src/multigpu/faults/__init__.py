"""When a rank dies or hangs, and several nodes: the runs of notebook 11.

Taught in ``notebooks/11_fault_tolerance.ipynb``, with :mod:`multigpu.snapshot`
(what a run saves to survive) and its script ``python -m multigpu.snapshot`` (the
one torchrun restarts). Three kinds of trouble, each run for real on this machine:

- **A rank dies.** :func:`run_with_restarts` runs the script under
  ``torchrun --max-restarts``; a rank kills itself (``--kill-rank``) or is killed
  from outside (:func:`kill_rank_from_outside`), torchrun restarts every rank, and
  they resume from the snapshot.
- **A rank hangs.** Its peers wait in a collective until the process group's
  timeout (30 minutes by default on gloo); the error they get names no culprit.
  :func:`multigpu.ranks.faults.late_rank` shows that with a short timeout, and how
  ``dist.monitored_barrier`` names the late rank;
  :func:`multigpu.ranks.faults.skipped_collective_rank` shows a rank that skips a
  collective, and how ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` names the collectives that
  do not match.
- **Several nodes.** :func:`run_nodes` starts one torchrun per "node" on this
  machine, joined by a c10d rendezvous on a store this process owns (a free port),
  exactly as two hosts would be.

Everything here is bounded in time and leaves no process behind.
"""

from multigpu.faults.nodes import (
    NODES_MODULE,
    node_options,
    rank_table_lines,
    run_nodes,
)
from multigpu.faults.restarts import (
    MODULE,
    RELIABLE_RESTARTS,
    final_weights,
    kill_rank_from_outside,
    restart_log,
    run_with_restarts,
    worker_pids,
)

__all__ = [
    "MODULE",
    "NODES_MODULE",
    "RELIABLE_RESTARTS",
    "final_weights",
    "kill_rank_from_outside",
    "node_options",
    "rank_table_lines",
    "restart_log",
    "run_nodes",
    "run_with_restarts",
    "worker_pids",
]
