"""The loop that snapshots and resumes: a mid-epoch resume with ranks started by
spawn (notebook 11). Models and data are float64, so "equal" means equal to ~1e-12.
"""

import torch

from multigpu.ranks.snapshot import snapshot_rank
from multigpu.runtime.launch import in_one_launch, spawn
from tests.ranks import seeded_snapshot_rank
from tests.snapshot.problem import EPOCHS, EVERY, script_problem, weights_equal


def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights(
    tmp_path, uninterrupted
):
    model, X, y, config = script_problem()
    folder = str(tmp_path)
    stopped, resumed = spawn(
        in_one_launch,
        2,
        [
            (snapshot_rank, (model, X, y, config, folder, EVERY, 12)),
            (snapshot_rank, (model, X, y, config, folder, EVERY)),
        ],
        timeout=60,
    )[0]
    assert len(stopped.step_loss) == 12  # then "crashed" after step 12 (epoch 2)
    assert len(resumed.step_loss) == EPOCHS * 8 - 10  # from the snapshot of step 10
    weights_equal(resumed.parameters, uninterrupted)
    assert resumed.step_loss[:2] == stopped.step_loss[10:12]  # the same batches again


def test_a_model_with_dropout_resumes_to_the_uninterrupted_weights(tmp_path):
    """The restored generators drive dropout exactly as if the run had not stopped:
    the loader draws its seed from a generator of its own, not the global one."""
    _, X, y, config = script_problem(samples=128, epochs=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 32),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(32, 10),
    ).double()
    folders = [str(tmp_path / name) for name in ("whole", "parts")]
    whole, stopped, resumed = spawn(
        in_one_launch,
        2,
        [
            (seeded_snapshot_rank, (model, X, y, config, folders[0], 1)),
            (seeded_snapshot_rank, (model, X, y, config, folders[1], 1, 3)),
            (seeded_snapshot_rank, (model, X, y, config, folders[1], 1)),
        ],
        timeout=60,
    )[0]
    assert len(stopped.step_loss) == 3 and len(resumed.step_loss) == 1
    weights_equal(resumed.parameters, whole.parameters)
