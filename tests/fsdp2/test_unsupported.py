"""What the registry says FSDP2 cannot take (tests/hard_cases.py, ``unsupported``) is
true of PyTorch's fully_shard: a module that some ranks' batches run and others'
skip leaves the ranks that run it waiting in its all-gather, forever but for the
launcher's collective timeout. (The course's ZeRO-3 and FSDP by hand refuse it by
name instead; tests/zero, tests/fsdp.)"""

import pytest
import torch

from multigpu.core.train import TrainConfig
from multigpu.ranks import zero as zero_ranks
from multigpu.runtime.launch import WorkerError, spawn
from tests.hard_cases import BY_NAME, CASES, hard_case_data

CONFIG = TrainConfig(epochs=2, batch_size=12, lr=0.05)  # as tests/zero: 6 steps
WAIT_S = 3.0  # how long a rank waits in a collective before the launch fails


@pytest.mark.parametrize(
    "case", [c for c in CASES if "fsdp2" in c.unsupported], ids=lambda c: c.name
)
def test_fsdp2_waits_on_what_the_registry_calls_unsupported(case):
    assert case is BY_NAME[case.name]
    X, y = hard_case_data()
    models = [case.build(torch.float64, seed=rank) for rank in range(2)]
    with pytest.raises(WorkerError) as error:
        spawn(zero_ranks.fsdp2_runs_rank, 2, [(models, X, y, CONFIG)], timeout=WAIT_S)
    assert error.value.timed_out, str(error.value)
    assert "Timed out" in str(error.value)
