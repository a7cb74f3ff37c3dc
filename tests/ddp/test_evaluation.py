"""Evaluation over the ranks counts every sample exactly once."""

from multigpu.core.train import evaluate


def test_distributed_accuracy_equals_single_process_accuracy_exactly(
    runs, problem, eval_set
):
    model, _, _ = problem
    _, single = evaluate(model, [eval_set])
    assert single == 0.4
    world_size = len(runs["eval"])
    for result in runs["eval"]:
        assert result["every sample once"] == single
        if world_size in (3, 4):  # padded: samples 0 and 1 (both right) twice
            assert result["padded / len(dataset)"] == 0.6
            assert result["padded / total_size"] == 0.5
