"""Tests for multigpu.pipeline.torch_api: PyTorch's ScheduleGPipe and Schedule1F1B
on gloo equal one process and the hand-built schedules on the hard-case model
(float64, 1e-12) when the micro-batches are equal; with 41 samples in 4 they fail
with PyTorch's own error (its stages size every receive from micro-batch 0)."""

import pytest
import torch

from multigpu.pipeline import merge_stage_results, one_process_gradients
from multigpu.ranks.pipeline import (
    pipeline_rank,
    run_torch_pipelines,
    torch_pipeline_rank,
)
from multigpu.runtime.launch import WorkerError, in_one_launch, spawn
from tests.pipeline.problem import data, hard_sequential

STEPS = [(4, "gpipe"), (4, "1f1b"), (8, "1f1b")]


def _merged(ranks):
    gradients = {}
    for result in ranks:
        gradients.update(result["gradients"])
    return ranks[-1]["loss"], gradients


def _distance(a, b):
    assert a.keys() == b.keys()
    worst = 0.0
    for key, value in b.items():
        if value is None:
            assert a[key] is None, key
        else:
            worst = max(worst, (a[key] - value).abs().max().item())
    return worst


def test_torch_schedules_equal_one_process_and_the_hand_built_ones():
    X, y = data()
    X, y = X[:40], y[:40]  # 40 samples: 4 or 8 equal micro-batches
    model = hard_sequential()
    calls = [(torch_pipeline_rank, (model, X, y, *step)) for step in STEPS]
    calls += [(pipeline_rank, (model, X, y, *step)) for step in STEPS]
    per_rank = spawn(in_one_launch, 4, calls, timeout=60)  # one launch for both
    steps = [[ranks[k] for ranks in per_rank] for k in range(len(calls))]
    torch_runs = steps[: len(STEPS)]
    ours = [merge_stage_results(ranks) for ranks in steps[len(STEPS) :]]
    loss, reference = one_process_gradients(model, X, y)
    for ranks, hand_built in zip(torch_runs, ours, strict=True):
        torch_loss, gradients = _merged(ranks)
        assert abs(torch_loss - loss) < 1e-12
        assert _distance(gradients, reference) < 1e-12
        assert _distance(gradients, hand_built.gradients) < 1e-12


def test_torch_schedule_fails_on_unequal_microbatches():
    X, y = data()  # 41 samples: micro-batches of 11, 10, 10, 10
    with pytest.raises(WorkerError) as error:
        run_torch_pipelines(hard_sequential(), X, y, 2, [(4, "gpipe")])
    assert (
        "Rank 1 of 2 failed with ValueError: Expected input batch_size (11) to match "
        "target batch_size (10)."
    ) in str(error.value)


def test_torch_pipeline_step_refuses_an_unknown_schedule():
    from multigpu.pipeline import torch_pipeline_step

    with pytest.raises(ValueError, match="Unknown schedule 'interleaved'"):
        torch_pipeline_step(0, 1, hard_sequential(), *data(), 1, "interleaved")


def test_data_is_float64():
    assert data()[0].dtype == torch.float64
