"""Snapshots that let a DDP run survive a dead rank and resume mid-epoch (11).

Taught in ``notebooks/11_fault_tolerance.ipynb``. A *snapshot* is a checkpoint
written often (every ``every`` steps, not once per epoch) that holds everything
the next step depends on: a run restarted from it goes on with the same numbers:

- the model and the optimizer (momentum buffers included);
- where the run stands: ``epoch``, ``step`` (optimizer steps done in that epoch)
  and ``global_step`` (steps done in all) (:class:`Position`);
- the sampler's state: its seed, the number of ranks and the samples each rank has
  already taken this epoch (:class:`ResumableSampler` skips them on resuming);
- every rank's random number generators (torch, NumPy, Python; CUDA where there is
  one) and its losses of the epoch so far, gathered to rank 0 with one collective,
  since each rank draws its own random numbers (dropout, augmentation).

Rank 0 writes it atomically (``checkpoint.write_atomically``: a killed save leaves
the previous snapshot, never half a file); every rank reads it at start with
``map_location`` (:func:`load_snapshot`). The training loop that does this is
:func:`train_with_snapshots`, which the package's script, ``python -m
multigpu.snapshot --snapshot DIR``, runs under torchrun::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 \\
        --max-restarts=3 -m multigpu.snapshot --snapshot DIR --snapshot-every 5 \\
        --kill-rank 1 --kill-at-step 13

``--kill-rank R --kill-at-step S``: rank R kills itself with SIGKILL after step S
(counted from 1), once (:class:`Fault`; a file in the folder remembers it). Ranks
note failures, deaths and resumes in ``DIR/events.jsonl`` (:func:`record_event`);
:func:`restart_figures` computes the restart's duration and the steps lost. Rank 0 holds
``DIR/run.lock`` while it trains, so a second live run there is refused (:mod:`.lock`).
"""

from multigpu.snapshot.events import (
    EVENTS_FILE,
    RESTART_COUNT,
    read_events,
    record_event,
    restart_figures,
)
from multigpu.snapshot.files import (
    SNAPSHOT_FILE,
    SnapshotMismatchError,
    load_snapshot,
    save_snapshot,
)
from multigpu.snapshot.injection import Fault, fire
from multigpu.snapshot.lock import (
    LOCK_FILE,
    FolderLock,
    SnapshotInUseError,
    describe_owner,
    lock_folder,
)
from multigpu.snapshot.loop import train_with_snapshots
from multigpu.snapshot.rng import rng_state, set_rng_state
from multigpu.snapshot.sampler import Position, ResumableSampler

__all__ = [
    "EVENTS_FILE",
    "LOCK_FILE",
    "RESTART_COUNT",
    "SNAPSHOT_FILE",
    "Fault",
    "FolderLock",
    "Position",
    "ResumableSampler",
    "SnapshotInUseError",
    "SnapshotMismatchError",
    "describe_owner",
    "fire",
    "load_snapshot",
    "lock_folder",
    "read_events",
    "record_event",
    "restart_figures",
    "rng_state",
    "save_snapshot",
    "set_rng_state",
    "train_with_snapshots",
]
