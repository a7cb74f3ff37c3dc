"""Rank functions of the snapshot tests: what the loop says and refuses (11). The
tests' other rank functions are in tests/ranks/__init__.py."""

from __future__ import annotations

from functools import partial

from multigpu import ddp, snapshot


def interrupting_save(at_step, global_batch, path, model, optimizer, position, *rest):
    """save_snapshot, except that the save of step ``at_step`` is a Ctrl-C: a
    KeyboardInterrupt before anything is written, on every rank."""
    if position.global_step == at_step:
        raise KeyboardInterrupt
    snapshot.save_snapshot(
        path, model, optimizer, position, *rest, global_batch=global_batch
    )


def logged_snapshot_rank(
    rank, world_size, model, X, y, config, folder, every, interrupt_at=None
):
    """train_with_snapshots with rank 0's log lines kept: {"steps": steps trained,
    "error": (type, text) of a refusal or an interruption, or None, "lines": ...}."""
    lines = []
    options = {}
    if interrupt_at is not None:
        options["save"] = partial(interrupting_save, interrupt_at, config.batch_size)
    outcome = {"steps": None, "error": None, "lines": lines}
    try:
        history = snapshot.train_with_snapshots(
            model, X, y, config, folder, every, log=lines.append, **options
        )
        outcome["steps"] = len(history.step_loss)
    except (
        snapshot.SnapshotInUseError,
        snapshot.SnapshotMismatchError,
        ddp.Interrupted,
    ) as error:
        outcome["error"] = (type(error).__name__, str(error))
    return outcome
