"""Wrapping a model in DDP broadcasts rank 0's weights."""

import pytest


@pytest.mark.parametrize("runs", [2], indirect=True, ids=["world2"])
def test_ddp_broadcasts_rank_0_weights_at_construction(runs):
    for result in runs["broadcast"]:
        assert result["differed before"] and result["agree after"]
        assert result["equal rank 0's initial weights"]
