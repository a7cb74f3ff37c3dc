"""train_ranks_arithmetic_adam on one "rank" is the plain one-process run, bit for
bit (the multi-rank runs are tested in test_sharded.py)."""

import torch

from multigpu import zero
from multigpu.core.train import TrainConfig
from multigpu.fsdp import train_ranks_arithmetic_adam
from tests.hard_cases import hard_case_data, hard_case_model


def test_the_ranks_arithmetic_on_one_rank_is_one_process():
    X, y = hard_case_data(dtype=torch.float32)
    model = hard_case_model(torch.float32)
    config = TrainConfig(epochs=1, batch_size=12, lr=0.05)
    ours = train_ranks_arithmetic_adam(model, X, y, config, world_size=1)
    plain = zero.train_one_process_adam(model, X, y, config).parameters
    assert all(torch.equal(ours[name], plain[name]) for name in plain)
    two = train_ranks_arithmetic_adam(model, X, y, config, world_size=2)
    assert not all(torch.equal(two[name], plain[name]) for name in plain)
