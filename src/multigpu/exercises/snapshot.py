"""The checker of notebook 11's exercise where the learner writes a snapshot's save
and load: stopped, then resumed in the middle of an epoch, the run must go on
exactly as the uninterrupted one (11)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import torch

from multigpu.core.compare import max_parameter_difference
from multigpu.ranks.snapshot_exercises import PROBE_STOP, snapshot_probe_rank
from multigpu.runtime.launch import WorkerError, spawn

GENERATORS = {"torch": "torch's", "numpy": "NumPy's", "python": "Python's"}


def _same(a: Any, b: Any) -> bool:
    """Equal, tensors compared by value, in nested dicts, lists and tuples."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and (a.shape == b.shape and torch.equal(a, b))
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _rng_mistake(ranks: list[dict[str, Any]]) -> str | None:
    """What is wrong with the generators each rank got back, or None."""
    for rank, report in enumerate(ranks):
        saved, back = report["saved"]["rng"], report["restored"]["rng"]
        if _same(saved, back):
            continue
        if rank > 0 and _same(ranks[0]["saved"]["rng"], back):
            return (
                f"FAIL: rank {rank} got rank 0's random number generators back, not "
                "its own: its random augmentation after the resume "
                "repeats rank 0's. Gather every rank's rng_state() in save "
                "(dist.all_gather_object, on every rank) and in load call "
                "set_rng_state(saved_ranks[dist.get_rank()])."
            )
        lost = [GENERATORS[k] for k in GENERATORS if not _same(saved[k], back[k])]
        return (
            f"FAIL: rank {rank}'s random number generators were not restored "
            f"({', '.join(lost)} differ from the snapshot's): after the resume its "
            "random augmentation differs from the uninterrupted run's. "
            "In save, gather every rank's rng_state() (dist.all_gather_object) into "
            "the snapshot; in load, call set_rng_state with this rank's."
        )
    return None


def check_snapshot(
    save: Callable, load: Callable, timeout: float = 30.0
) -> tuple[bool, str]:
    """Do ``save(path, model, optimizer, position, sampler, rank_state)`` and
    ``load(path, model, optimizer, sampler, device)`` let a run stopped in the
    middle of an epoch resume exactly where it stood? (passed, what to fix) (11).

    On 2 ranks, one launch (:func:`multigpu.ranks.snapshot_exercises.\
snapshot_probe_rank`): a run with snapshots every 4 steps stops after step 9 and
    is resumed with a fresh seed in every generator, as new processes would start;
    what ``load`` restores is compared with what ``save`` was given, and the final
    weights with an uninterrupted run's. Both functions must live in a module the
    ranks can import (``%%module``)."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            ranks = spawn(snapshot_probe_rank, 2, save, load, folder, timeout=timeout)
        except WorkerError as error:
            if error.timed_out or "timed out" in str(error).lower():
                return False, (
                    f"FAIL: the ranks waited for each other until the {timeout:g} s "
                    "timeout: a collective (dist.all_gather_object) ran on some "
                    "ranks only. Call it on every rank, before `if rank == 0:`."
                )
            last = str(error).strip().splitlines()[-1]
            return False, f"FAIL: your save or load raised an error: {last}"
    saved, restored = ranks[0]["saved"], ranks[0]["restored"]
    if "position" not in saved:
        return False, "FAIL: save was never called: did the run train at all?"
    want, got = saved["position"], restored["position"]
    if got.global_step == 0 and want.global_step > 0:
        return False, (
            "FAIL: load returned the start of training (global step 0), so the "
            f"resumed run started again from scratch instead of at step "
            f"{want.global_step}. Save the Position in the snapshot and return it."
        )
    if got.epoch == want.epoch and got.step == 0 < want.step:
        return False, (
            f"FAIL: the run resumed at the start of epoch {want.epoch + 1}, not at "
            f"its step {want.step}: the sampler dealt that epoch's first "
            f"{want.step} batches again (samples repeated). Save the whole Position "
            "(epoch, step, global_step) and return it from load."
        )
    if got != want:
        return False, (
            f"FAIL: load returned {got}, but the snapshot was saved at {want}. "
            "Return the Position that save was given."
        )
    if max_parameter_difference(saved["weights"], restored["weights"]) > 0:
        return False, (
            "FAIL: the model's weights after load are not the snapshot's. Save "
            "model's state (save_checkpoint(path, model, optimizer, ...)) and load "
            "it into the model on every rank (load_checkpoint(path, model, ...))."
        )
    if not _same(saved["momentum"], restored["momentum"]):
        return False, (
            "FAIL: the optimizer's state was not restored: SGD's momentum buffers "
            "start again from zero, so the steps after the resume differ (momentum "
            "lost). Pass the optimizer to save_checkpoint and to load_checkpoint."
        )
    mistake = _rng_mistake(ranks)
    if mistake:
        return False, mistake
    if any(report["saved"]["in_place"] for report in ranks):
        return False, (
            "FAIL: the snapshot file was rewritten in place (torch.save to its "
            "path): a rank killed while saving leaves half a file and no snapshot "
            "to resume from (not atomic). Write with save_checkpoint (or "
            "checkpoint.write_atomically), which writes a temporary file and "
            "renames it."
        )
    difference = max_parameter_difference(
        ranks[0]["resumed"], ranks[0]["uninterrupted"]
    )
    if difference > 1e-12:
        return False, (
            "FAIL: everything save was given came back, yet the resumed run ends "
            f"{difference:.1e} away from the uninterrupted run's weights: the next "
            "steps depend on something load did not put back. Compare your load "
            "with multigpu.snapshot.load_snapshot."
        )
    return True, (
        f"PASS: stopped after step {PROBE_STOP} and resumed from the snapshot "
        f"of step {want.global_step} (epoch {want.epoch + 1}, step {want.step}), "
        "every rank got back its own generators, the weights and the momentum, and "
        "the run ended at the uninterrupted run's weights."
    )
