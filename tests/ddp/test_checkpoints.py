"""Rank 0 saves, every rank resumes: as if never interrupted."""

import pytest

from tests.ddp.problems import assert_same


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_resumed_run_equals_an_uninterrupted_one(runs, reference):
    for first, resumed in zip(runs["first epoch"], runs["resumed"]):
        assert len(first.train_loss) == 1 and len(resumed.train_loss) == 1
        assert_same(reference.parameters, resumed.parameters)
