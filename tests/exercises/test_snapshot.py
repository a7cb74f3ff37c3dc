"""11's checker: the reference save/load pass; each mistake learners make is named."""

from __future__ import annotations

import pytest

from multigpu import snapshot
from multigpu.exercises.snapshot import check_snapshot
from tests.exercises import wrong_snapshot as wrong


@pytest.mark.parametrize(
    ("save", "load"),
    [
        (snapshot.save_snapshot, snapshot.load_snapshot),
        (wrong.save_right, wrong.load_right),
    ],
    ids=["multigpu.snapshot", "learner's right answer"],
)
def test_a_right_snapshot_passes(save, load):
    passed, message = check_snapshot(save, load)
    assert passed, message
    assert message == (
        "PASS: stopped after step 9 and resumed from the snapshot of step 8 (epoch 2, "
        "step 2), every rank got back its own generators and state, the weights "
        "and the momentum, and the run ended at the uninterrupted run's weights."
    )


@pytest.mark.parametrize(
    ("save", "load", "expected"),
    [
        (
            wrong.save_no_rng,
            wrong.load_no_rng,
            "FAIL: rank 0's random number generators were not restored (",
        ),
        (
            wrong.save_rank0_rng,
            wrong.load_rank0_rng,
            "FAIL: rank 1 got rank 0's random number generators back, not its own",
        ),
        (
            wrong.save_right,
            wrong.load_epoch_start,
            "FAIL: the run resumed at the start of epoch 2, not at its step 2: the "
            "sampler dealt that epoch's first 2 batches again (samples repeated).",
        ),
        (
            wrong.save_no_optimizer,
            wrong.load_no_optimizer,
            "FAIL: the optimizer's state was not restored: SGD's momentum buffers "
            "start again from zero",
        ),
        (
            wrong.save_in_place,
            wrong.load_in_place,
            "FAIL: the snapshot file was rewritten in place (torch.save to its path)",
        ),
        (
            wrong.save_rank0_gathers,
            wrong.load_right,
            "FAIL: the ranks waited for each other until the 5 s timeout: a "
            "collective (dist.all_gather_object) ran on some ranks only, and the "
            "others never joined it.",
        ),
        (
            wrong.save_right,
            wrong.load_no_rank_state,
            "FAIL: load returned {} as rank 0's own state, not the 2 losses of "
            "epoch 2 that its save was given: the resumed epoch's mean loss then "
            "counts only the steps after the resume",
        ),
    ],
    ids=["no RNG", "rank 0's RNG only", "no sampler position", "no optimizer",
         "not atomic", "gather on rank 0 only", "no rank state"],
)  # fmt: skip
def test_each_mistake_is_named(save, load, expected):
    passed, message = check_snapshot(save, load, timeout=5.0)
    assert not passed
    assert message.startswith(expected), message
