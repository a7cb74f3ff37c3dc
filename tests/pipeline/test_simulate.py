"""Tests for multigpu.pipeline.simulate: in time slots the schedules' idle time is
exactly (p - 1)(t_f + t_b) per stage, and a deadlock or a crossed message is named."""

from fractions import Fraction

import pytest

from multigpu.costmodel.pipeline import pipeline_bubble_fraction
from multigpu.pipeline import (
    bubble_fraction,
    busy_time,
    schedule_actions,
    simulate_schedule,
    step_span,
)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (3, 5), (4, 2), (4, 4), (4, 8)])
def test_idle_slots_are_exactly_the_bubble(schedule, p, m):
    simulation = simulate_schedule(schedule_actions(schedule, p, m), 1.0, 2.0)
    assert not simulation.deadlocked and not simulation.mismatches
    start, end = step_span(simulation.blocks)
    assert end - start == (m + p - 1) * 3  # m blocks of 1 + 2 slots, plus the fill
    for stage in range(p):
        assert end - start - busy_time(simulation.blocks, stage) == (p - 1) * 3
    exact = Fraction(p - 1, m + p - 1)
    assert bubble_fraction(simulation.blocks, p) == pytest.approx(
        float(exact), abs=1e-15
    )
    assert pipeline_bubble_fraction(p, m) == pytest.approx(float(exact), abs=1e-15)


def test_one_f_one_b_order_in_time_on_two_stages():
    blocks = simulate_schedule(schedule_actions("1f1b", 2, 3)).blocks
    stage0 = [
        (b.op[0].upper() + str(b.microbatch), b.start) for b in blocks if b.stage == 0
    ]
    stage1 = [
        (b.op[0].upper() + str(b.microbatch), b.start) for b in blocks if b.stage == 1
    ]
    assert stage0 == [("F0", 0), ("F1", 1), ("B0", 4), ("F2", 6), ("B1", 7), ("B2", 10)]
    assert stage1 == [("F0", 1), ("B0", 2), ("F1", 4), ("B1", 5), ("F2", 7), ("B2", 8)]


def test_unpaired_one_f_one_b_deadlocks_in_the_first_steady_send():
    simulation = simulate_schedule(schedule_actions("1f1b unpaired", 2, 4))
    assert simulation.stuck == {0: ("send_activation", 1), 1: ("send_gradient", 0)}


def test_crossed_microbatches_are_named():
    actions = schedule_actions("gpipe", 2, 2)
    actions[1] = [  # stage 1 receives micro-batch 1 first
        ("recv_activation", 1), ("forward", 1), ("recv_activation", 0), ("forward", 0),
        ("backward", 0), ("send_gradient", 0), ("backward", 1), ("send_gradient", 1),
    ]  # fmt: skip
    simulation = simulate_schedule(actions)
    assert simulation.mismatches[0] == (
        "stage 1 receives activation(1) but stage 0 sent activation(0) at that point"
    )


def test_a_list_completes_once_its_neighbour_has_posted_in_a_later_round():
    # Stage 0 posts its pair first; stage 1 then posts a pair that must wait for
    # forward(2). Stage 0's pair is complete then, and gloo completes it: no deadlock.
    actions = [
        [
            ("forward", 0), ("send_activation", 0), ("forward", 1),
            [("send_activation", 1), ("recv_gradient", 0)], ("backward", 0),
            ("forward", 2), [("send_activation", 2), ("recv_gradient", 1)],
            ("backward", 1), ("recv_gradient", 2), ("backward", 2),
        ],
        [
            ("recv_activation", 0), ("forward", 0), ("recv_activation", 1),
            ("forward", 1), ("backward", 0),
            [("send_gradient", 0), ("recv_activation", 2)], ("forward", 2),
            ("backward", 1), ("send_gradient", 1), ("backward", 2),
            ("send_gradient", 2),
        ],
    ]  # fmt: skip
    simulation = simulate_schedule(actions)
    assert not simulation.deadlocked and not simulation.mismatches
    assert len(simulation.blocks) == 12
