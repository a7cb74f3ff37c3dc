"""hvd.broadcast_parameters and hvd.broadcast_optimizer_state make ranks that start
from different seeds agree. The launches are in conftest.py."""

import pytest
import torch

from multigpu.core.compare import max_parameter_difference
from tests.horovod_api.problems import FORMS


@pytest.mark.parametrize("form", FORMS)
def test_broadcasts_make_ranks_from_different_seeds_agree(runs, form):
    results = runs[form]
    root = results[0]
    if len(results) > 1:
        assert max_parameter_difference(results[1]["before"], root["before"]) > 0.01
    for result in results:
        assert max_parameter_difference(result["after"], root["before"]) == 0
        assert result["lr"] == 0.1  # rank 0's, not 0.5
        for mine, roots in zip(result["momentum"], root["momentum"], strict=True):
            assert mine is not None and torch.equal(mine, roots)
    assert all(m.abs().sum() > 0 for m in root["momentum"])
