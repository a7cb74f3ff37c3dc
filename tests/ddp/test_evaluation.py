"""Evaluation over the ranks counts every sample exactly once."""

import math

import torch

from multigpu.core.train import evaluate


def test_distributed_accuracy_equals_one_process_accuracy_exactly(
    runs, problem, eval_set
):
    model, _, _ = problem
    single_loss, single = evaluate(model, [eval_set])
    assert single == 0.4
    world_size = len(runs["eval"])
    for result in runs["eval"]:
        loss, accuracy = result["every sample once"]
        assert accuracy == single
        assert math.isclose(loss, single_loss, rel_tol=1e-12)
        if world_size in (3, 4):  # padded: samples 0 and 1 (both right) twice
            assert result["padded / len(dataset)"][1] == 0.6
            assert result["padded / total_size"][1] == 0.5


def test_padded_loss_counts_the_repeated_samples_twice(runs, problem, eval_set):
    model, _, _ = problem
    X, y = eval_set
    with torch.no_grad():
        losses = torch.nn.functional.cross_entropy(model(X), y, reduction="none")
    world_size = len(runs["eval"])
    repeated = -len(y) % world_size  # the sampler pads with the first indices
    padded_sum = (losses.sum() + losses[:repeated].sum()).item()
    for result in runs["eval"]:
        by_dataset, _ = result["padded / len(dataset)"]
        by_total_size, _ = result["padded / total_size"]
        assert math.isclose(by_dataset, padded_sum / len(y), rel_tol=1e-12)
        total_size = len(y) + repeated
        assert math.isclose(by_total_size, padded_sum / total_size, rel_tol=1e-12)
        if repeated:
            assert not math.isclose(by_dataset, losses.mean().item(), rel_tol=1e-6)
