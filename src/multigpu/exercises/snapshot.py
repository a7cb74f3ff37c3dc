"""The checker of notebook 11's exercise where the learner writes a snapshot's save
and load: stopped, then resumed in the middle of an epoch, the run must go on
exactly as the uninterrupted one (11)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import torch

from multigpu.core.compare import max_parameter_difference
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.ranks.snapshot_exercises import PROBE_STOP, snapshot_probe_rank
from multigpu.runtime.launch import DEFAULT_TIMEOUT_S, WorkerError, spawn

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
                "its own: its random augmentation after the resume repeats rank "
                "0's. Each rank draws its own numbers, so the snapshot must hold "
                "every rank's generators, and each rank must take back its own."
            )
        lost = [GENERATORS[k] for k in GENERATORS if not _same(saved[k], back[k])]
        return (
            f"FAIL: rank {rank}'s random number generators were not restored "
            f"({', '.join(lost)} differ from the snapshot's): after the resume its "
            "random augmentation differs from the uninterrupted run's (look at "
            "rng_state and set_rng_state)."
        )
    return None


def _rank_state_mistake(ranks: list[dict[str, Any]]) -> str | None:
    """What is wrong with the state each rank's load returned as its own, or None."""
    for rank, report in enumerate(ranks):
        given, back = report["saved"]["rank_state"], report["restored"]["rank_state"]
        if _same(given, back):
            continue
        losses = len(given.get("losses", []))
        epoch = report["saved"]["position"].epoch + 1
        uninterrupted, resumed = report["uninterrupted_loss"], report["resumed_loss"]
        return (
            f"FAIL: load returned {back!r} as rank {rank}'s own state, not the "
            f"{losses} losses of epoch {epoch} that its save was given: the resumed "
            "epoch's mean loss then counts only the steps after the resume, and "
            f"differs from the uninterrupted run's ({resumed:.4f} instead of "
            f"{uninterrupted:.4f})."
        )
    return None


def check_snapshot(
    save: Callable, load: Callable, timeout: float = DEFAULT_TIMEOUT_S
) -> ExerciseResult:
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
                return fail(
                    f"FAIL: the ranks waited for each other until the {timeout:g} s "
                    "timeout: a collective (dist.all_gather_object) ran on some "
                    "ranks only, and the others never joined it."
                )
            last = str(error).strip().splitlines()[-1]
            return fail(f"FAIL: your save or load raised an error: {last}")
    saved, restored = ranks[0]["saved"], ranks[0]["restored"]
    if "position" not in saved:
        return fail("FAIL: save was never called: did the run train at all?")
    want, got = saved["position"], restored["position"]
    if got.global_step == 0 and want.global_step > 0:
        return fail(
            "FAIL: load returned the start of training (global step 0), so the "
            f"resumed run started again from scratch instead of at step "
            f"{want.global_step}: the snapshot's Position did not come back."
        )
    if got.epoch == want.epoch and got.step == 0 < want.step:
        return fail(
            f"FAIL: the run resumed at the start of epoch {want.epoch + 1}, not at "
            f"its step {want.step}: the sampler dealt that epoch's first "
            f"{want.step} batches again (samples repeated). The step within the "
            "epoch was lost."
        )
    if got != want:
        return fail(
            f"FAIL: load returned {got}, but the snapshot was saved at {want}: "
            "the resumed run would deal other batches than the uninterrupted one."
        )
    if max_parameter_difference(saved["weights"], restored["weights"]) > 0:
        return fail(
            "FAIL: the model's weights after load are not the snapshot's: the "
            "resumed run starts from other weights than the ones saved."
        )
    if not _same(saved["momentum"], restored["momentum"]):
        return fail(
            "FAIL: the optimizer's state was not restored: SGD's momentum buffers "
            "start again from zero, so the steps after the resume differ (momentum "
            "lost)."
        )
    mistake = _rng_mistake(ranks)
    if mistake:
        return fail(mistake)
    mistake = _rank_state_mistake(ranks)
    if mistake:
        return fail(mistake)
    if any(report["saved"]["in_place"] for report in ranks):
        return fail(
            "FAIL: the snapshot file was rewritten in place (torch.save to its "
            "path): a rank killed while saving leaves half a file and no snapshot "
            "to resume from (not atomic)."
        )
    difference = max_parameter_difference(
        ranks[0]["resumed"], ranks[0]["uninterrupted"]
    )
    if difference > 1e-12:
        return fail(
            "FAIL: everything save was given came back, yet the resumed run ends "
            f"{difference:.1e} away from the uninterrupted run's weights: the next "
            "steps depend on something load did not put back."
        )
    return ok(
        f"PASS: stopped after step {PROBE_STOP} and resumed from the snapshot "
        f"of step {want.global_step} (epoch {want.epoch + 1}, step {want.step}), "
        "every rank got back its own generators and state, the weights and the "
        "momentum, and the run ended at the uninterrupted run's weights."
    )
