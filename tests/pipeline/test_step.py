"""Tests for multigpu.pipeline.step and executor on ranks: GPipe and 1F1B on 2 and 4
ranks equal one process on the whole batch (float64 within 1e-12, float32 within
1e-6) on every hard case the registry gives the pipeline, hold the micro-batches
and send the bytes of the formulas, and run their blocks in the schedule's order.
One launch per world size."""

import multiprocessing

import pytest
import torch

from multigpu.costmodel.pipeline import (
    in_flight_microbatches,
    pipeline_bubble_fraction,
    pp_bytes_per_step,
)
from multigpu.pipeline import (
    bubble_fraction,
    max_gradient_difference,
    merge_stage_results,
    one_process_gradients,
    schedule_actions,
)
from multigpu.ranks.pipeline import pipeline_rank, run_pipelines
from multigpu.runtime.launch import WorkerError, in_one_launch, spawn
from tests.pipeline.problem import PIPELINE_CASES, data, hard_sequential

DELAYS = (0.01, 0.02)  # seconds added to each forward and backward
STEPS = {  # name -> (dtype, num_microbatches, schedule, delays)
    "gpipe m=4": (torch.float64, 4, "gpipe", (0.0, 0.0)),
    "1f1b m=4": (torch.float64, 4, "1f1b", (0.0, 0.0)),
    "1f1b m=3": (torch.float64, 3, "1f1b", (0.0, 0.0)),
    "1f1b m=1": (torch.float64, 1, "1f1b", (0.0, 0.0)),
    "1f1b m=6": (torch.float64, 6, "1f1b", (0.0, 0.0)),
    "gpipe m=5 float32": (torch.float32, 5, "gpipe", (0.0, 0.0)),
    "1f1b m=5 float32": (torch.float32, 5, "1f1b", (0.0, 0.0)),
    "gpipe timed": (torch.float64, 4, "gpipe", DELAYS),
    "1f1b timed": (torch.float64, 4, "1f1b", DELAYS),
}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def runs(request):
    """(world_size, {(case name, step name): the merged PipelineRun})."""
    world_size = request.param
    keys, calls = [], []
    for case in PIPELINE_CASES:
        for name, (dtype, m, schedule, delays) in STEPS.items():
            X, y = data(dtype)
            model = case.sequential(dtype)
            keys.append((case.name, name))
            calls.append((pipeline_rank, (model, X, y, m, schedule, delays)))
    per_rank = spawn(in_one_launch, world_size, calls, timeout=60)
    merged = [merge_stage_results([r[k] for r in per_rank]) for k in range(len(calls))]
    return world_size, dict(zip(keys, merged, strict=True))


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=lambda case: case.name)
def test_every_schedule_equals_one_process(runs, case):
    _, results = runs
    for name, (dtype, *_) in STEPS.items():
        X, y = data(dtype)
        model = case.sequential(dtype)
        loss, reference = one_process_gradients(model, X, y)
        run = results[(case.name, name)]
        assert abs(run.loss - loss) < TOLERANCE[dtype], name
        assert run.gradients.keys() == reference.keys()
        for key, gradient in reference.items():
            if gradient is None:  # frozen, unused or never read
                assert run.gradients[key] is None, (name, key)
            else:
                difference = (run.gradients[key] - gradient).abs().max().item()
                assert difference < TOLERANCE[dtype], (name, key, difference)
        # the Sequential keeps the case's parameters that never get a gradient
        assert any(g is None for g in reference.values()) == bool(case.still), name


def test_in_flight_microbatches_and_their_bytes(runs):
    world_size, results = runs
    for (case_name, name), run in results.items():
        _, m, schedule, _ = STEPS[name]
        for stage in range(world_size):
            held = in_flight_microbatches(schedule, stage, world_size, m)
            assert run.peak_in_flight[stage] == held, (case_name, name, stage)
            saved = run.saved_bytes[stage]  # per micro-batch, in order
            window = max(sum(saved[k : k + held]) for k in range(m - held + 1))
            assert run.peak_saved_bytes[stage] == window, (case_name, name, stage)
        gpipe, one_f_one_b = (
            results[(case_name, "gpipe m=4")],
            results[(case_name, "1f1b m=4")],
        )
        if world_size == 2:  # stage 0 holds 4 micro-batches under GPipe, 2 under 1F1B
            assert gpipe.peak_saved_bytes[0] > one_f_one_b.peak_saved_bytes[0]


def test_bytes_sent_are_the_formula(runs):
    world_size, results = runs
    for (case_name, name), run in results.items():
        dtype = STEPS[name][0]
        hidden = 6  # every boundary of the hard-case models is 6 wide
        size = torch.finfo(dtype).bits // 8
        expected = [
            pp_bytes_per_step(41, 1, hidden, size, stage, world_size)
            for stage in range(world_size)
        ]
        assert run.bytes_sent == expected, (case_name, name)


def timed_again(world_size, case, name):
    """One more launch of one timed step of one case: the merged PipelineRun."""
    dtype, m, schedule, delays = STEPS[name]
    X, y = data(dtype)
    call = (pipeline_rank, (case.sequential(dtype), X, y, m, schedule, delays))
    per_rank = spawn(in_one_launch, world_size, [call], timeout=60)
    return merge_stage_results([r[0] for r in per_rank])


def test_blocks_run_in_the_schedule_order_and_the_bubble_is_near_the_formula(runs):
    world_size, results = runs
    formula = pipeline_bubble_fraction(world_size, 4)
    for case in PIPELINE_CASES:
        for name, schedule in (("gpipe timed", "gpipe"), ("1f1b timed", "1f1b")):
            run = results[(case.name, name)]
            actions = schedule_actions(schedule, world_size, 4)
            for stage in range(world_size):
                done = [(b.op, b.microbatch) for b in run.blocks if b.stage == stage]
                planned = [a for a in actions[stage] if a[0] in ("forward", "backward")]
                assert done == planned, (case.name, name, stage)
            # Timings only loosely: messages and a shared CPU add idle time, and
            # under a loaded machine a stage may wait for a core for 100 ms. The
            # step is timed again (up to 3 more launches) and the least disturbed
            # run counts; no run can idle much less than the formula.
            measured = [bubble_fraction(run.blocks, world_size)]
            while min(measured) >= formula + 0.3 and len(measured) < 4:
                again = timed_again(world_size, case, name)
                measured.append(bubble_fraction(again.blocks, world_size))
            assert all(b > formula - 0.05 for b in measured), (case.name, measured)
            assert min(measured) < formula + 0.3, (case.name, measured)


def test_max_gradient_difference_counts_a_missing_gradient_as_infinite():
    one = torch.ones(2, dtype=torch.float64)
    assert (
        max_gradient_difference({"a": one, "b": None}, {"a": 2 * one, "b": None}) == 1
    )
    assert max_gradient_difference({"a": one}, {"a": None}) == float("inf")
    with pytest.raises(ValueError, match="name different parameters"):
        max_gradient_difference({"a": one}, {"b": one})


def test_a_deadlock_ends_with_the_message_timeout_and_gloos_words():
    X, y = data()
    with pytest.raises(WorkerError) as error:
        run_pipelines(hard_sequential(), X, y, 2, [(4, "1f1b unpaired", (0, 0), 1.0)])
    text = str(error.value)
    assert "failed with MessageTimeoutError: stage " in text
    assert (
        "its neighbour never posted the matching message (a deadlock, or a message "
        "missing). gloo: Timed out waiting 1000ms for send operation to complete"
    ) in text
    assert multiprocessing.active_children() == []
