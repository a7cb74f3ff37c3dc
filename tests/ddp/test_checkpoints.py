"""Rank 0 saves, every rank resumes: as if never interrupted."""

import pytest
import torch

from multigpu import ddp
from multigpu.runtime.checkpoint import CheckpointMismatchError
from tests.ddp.problems import assert_same


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_resumed_run_equals_an_uninterrupted_one(runs, reference):
    for first, resumed in zip(runs["first epoch"], runs["resumed"]):
        assert len(first.train_loss) == 1 and len(resumed.train_loss) == 1
        assert_same(reference.parameters, resumed.parameters)


def test_resuming_with_another_lr_is_refused_by_name(tmp_path):
    """Without a process group: rank 0's save, and the resume every rank does."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    saved = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp.save_on_main(tmp_path / "last.pt", model, saved, epoch=1)
    asked = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    with pytest.raises(CheckpointMismatchError) as error:
        ddp.resume(tmp_path / "last.pt", model, asked, torch.device("cpu"))
    assert str(error.value) == (
        "last.pt was saved by a run whose optimizer had lr 0.05, and this run asks "
        "for 0.5: resuming would train with 0.05. Resume with lr 0.05, or start "
        "afresh with a new checkpoint file."
    )
    same = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    assert ddp.resume(tmp_path / "last.pt", model, same, torch.device("cpu")) == 1


def test_a_scheduler_s_lr_is_not_a_changed_setting():
    """A learning-rate scheduler moves lr as it goes (and notes initial_lr)."""
    asked = [{"lr": 0.1, "momentum": 0.9, "initial_lr": 0.1}]
    assert ddp.changed_setting(asked, [{**asked[0], "lr": 0.01}]) is None
    assert ddp.changed_setting(asked, [{**asked[0], "initial_lr": 0.2}]) == (
        "initial_lr",
        0.2,
        0.1,
    )
    plain = [{"lr": 0.1, "momentum": 0.9}]
    assert ddp.changed_setting(plain, [{"lr": 0.1, "momentum": 0.0}]) == (
        "momentum",
        0.0,
        0.9,
    )
