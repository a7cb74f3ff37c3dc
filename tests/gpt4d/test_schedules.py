"""Every pipeline schedule of torch.distributed.pipelining, on 2 ranks and 4 stages
of the tiny GPT, trains as one process does with scale_grads=False (and not with
the default, which divides by the micro-batches); the bubble of each plan, played
with unit times, is its formula's; the player finds deadlocks."""

import pytest

from multigpu.costmodel.gpt4d import schedule_bubble, zero_bubble_fraction
from multigpu.gpt4d.schedules import (
    PIPELINE_SCHEDULES,
    simulate_plan,
    stage_indices,
    summarize_runs,
)
from tests.gpt4d.conftest import SCHEDULE_CASES


def _case(schedule_runs, index):
    return [per_rank[index] for per_rank in schedule_runs]


@pytest.mark.parametrize(
    "index",
    range(len(SCHEDULE_CASES)),
    ids=lambda i: "-".join(map(str, SCHEDULE_CASES[i])),
)
def test_each_schedule_equals_one_process_only_without_scaling(schedule_runs, index):
    runs = _case(schedule_runs, index)
    worst = max(run["max_diff"] for run in runs)
    scale_grads = SCHEDULE_CASES[index][2]
    if scale_grads:  # gradients divided by 4 micro-batches: not one process
        assert worst > 1e-3
    else:
        assert worst < 1e-10
        last = [run["losses"] for run in runs if run["losses"][0] is not None]
        assert len(last) == 1
        assert last[0] == pytest.approx(runs[0]["reference_losses"], abs=1e-10)


@pytest.mark.parametrize(
    "index", range(len(SCHEDULE_CASES) - 1), ids=lambda i: SCHEDULE_CASES[i][0]
)
def test_each_plans_bubble_is_its_formulas(schedule_runs, index):
    schedule, microbatches, _ = SCHEDULE_CASES[index]
    per_rank = PIPELINE_SCHEDULES[schedule][1]
    plan = schedule_runs[0][index]["plan"]
    assert plan == schedule_runs[1][index]["plan"]  # every rank runs the same plan
    blocks, bubble = simulate_plan(plan, 2 * per_rank)
    assert len(blocks) == sum(len(actions) for actions in plan.values())
    assert bubble == pytest.approx(schedule_bubble(schedule, 2, microbatches))


def test_the_summary_plays_each_cases_plan(schedule_runs):
    rows = summarize_runs(schedule_runs)
    assert [(r["schedule"], r["scale_grads"]) for r in rows] == [
        (name, scale) for name, _, scale in SCHEDULE_CASES
    ]
    for index, row in enumerate(rows):
        worst = max(run["max_diff"] for run in _case(schedule_runs, index))
        assert row["max_diff"] == worst
        stages = 2 * PIPELINE_SCHEDULES[row["schedule"]][1]
        plan = schedule_runs[0][index]["plan"]
        assert (row["blocks"], row["bubble"]) == simulate_plan(plan, stages)
        assert row["microbatches"] == SCHEDULE_CASES[index][1]


def test_the_formulas():
    assert schedule_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert schedule_bubble("interleaved-1f1b", 4, 8) == pytest.approx(3 / 19)
    assert zero_bubble_fraction(4, 8, 2) == pytest.approx(3 / 51)
    with pytest.raises(ValueError, match="No formula for schedule 'chimera'"):
        schedule_bubble("chimera", 2, 4)


def test_stages_go_in_a_loop_or_a_v():
    assert stage_indices("interleaved-1f1b", 1, 4) == [1, 5]
    assert stage_indices("zbv", 1, 4) == [1, 6]
    assert stage_indices("1f1b", 3, 4) == [3]


def test_the_player_finds_a_deadlock():
    plan = {0: [(0, "F", 0), (0, "B", 0)], 1: [(1, "B", 0), (1, "F", 0)]}
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate_plan(plan, 2)


def test_the_player_on_a_plan_by_hand():
    plan = {0: [(0, "F", 0), (0, "B", 0)], 1: [(1, "F", 0), (1, "B", 0)]}
    blocks, bubble = simulate_plan(plan, 2)
    times = {(rank, kind): (start, end) for rank, _, kind, _, start, end in blocks}
    assert times == {
        (0, "F"): (0, 1),
        (1, "F"): (1, 2),
        (1, "B"): (2, 4),
        (0, "B"): (4, 6),
    }
    assert bubble == pytest.approx(1 - 6 / 12)
