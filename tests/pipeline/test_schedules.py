"""Tests for multigpu.pipeline.schedules: GPipe's and 1F1B's exact orders, the
micro-batches each holds, and the mistakes schedule_problem names."""

import pytest

from multigpu.costmodel.pipeline import in_flight_microbatches
from multigpu.pipeline import (
    gpipe_actions,
    in_flight_peak,
    one_f_one_b_actions,
    schedule_actions,
    schedule_problem,
)


def test_gpipe_order_on_two_stages():
    assert gpipe_actions(0, 2, 2) == [
        ("forward", 0), ("send_activation", 0), ("forward", 1), ("send_activation", 1),
        ("recv_gradient", 0), ("backward", 0), ("recv_gradient", 1), ("backward", 1),
    ]  # fmt: skip
    assert gpipe_actions(1, 2, 2) == [
        ("recv_activation", 0), ("forward", 0), ("recv_activation", 1), ("forward", 1),
        ("backward", 0), ("send_gradient", 0), ("backward", 1), ("send_gradient", 1),
    ]  # fmt: skip


def test_one_f_one_b_order_on_two_stages_pairs_the_steady_messages():
    assert one_f_one_b_actions(0, 2, 3) == [
        ("forward", 0), ("send_activation", 0),
        ("forward", 1), [("send_activation", 1), ("recv_gradient", 0)], ("backward", 0),
        ("forward", 2), [("send_activation", 2), ("recv_gradient", 1)], ("backward", 1),
        ("recv_gradient", 2), ("backward", 2),
    ]  # fmt: skip
    assert one_f_one_b_actions(1, 2, 3) == [
        ("recv_activation", 0),
        ("forward", 0), ("backward", 0), [("send_gradient", 0), ("recv_activation", 1)],
        ("forward", 1), ("backward", 1), [("send_gradient", 1), ("recv_activation", 2)],
        ("forward", 2), ("backward", 2), ("send_gradient", 2),
    ]  # fmt: skip


def test_unpaired_one_f_one_b_posts_each_message_alone():
    actions = one_f_one_b_actions(0, 2, 3, paired=False)
    assert not any(isinstance(a, list) for a in actions)
    assert actions[3:5] == [("send_activation", 1), ("recv_gradient", 0)]


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("num_microbatches", [1, 2, 3, 5, 8])
def test_in_flight_peaks_are_the_formula(num_stages, num_microbatches):
    for name in ("gpipe", "1f1b"):
        for stage, actions in enumerate(
            schedule_actions(name, num_stages, num_microbatches)
        ):
            assert (
                schedule_problem(stage, num_stages, num_microbatches, actions) is None
            )
            expected = in_flight_microbatches(name, stage, num_stages, num_microbatches)
            assert in_flight_peak(actions) == expected


def test_schedule_actions_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="Unknown schedule 'zb'"):
        schedule_actions("zb", 2, 2)


def _without(actions, pair):
    out = []
    for action in actions:
        if isinstance(action, list):
            kept = [p for p in action if p != pair]
            out += [kept] if len(kept) > 1 else kept
        elif action != pair:
            out.append(action)
    return out


@pytest.mark.parametrize(
    ("stage", "actions", "problem"),
    [
        (1, "missing send", "stage 1 never does send_gradient(2)"),
        (0, "double send", "stage 0 does send_activation(0) twice"),
        (1, "last sends", "stage 1 has no next stage, yet it does send_activation(0)"),
        (0, "backward first", "stage 0 runs backward(0) before forward(0)"),
        (0, "not a list", "the schedule returned tuple, not a list of actions"),
        (0, "compute in group", "('forward', 0) is a computation inside a list"),
        (0, "bad index", "forward(3): there are only micro-batches 0-2"),
        (1, "early use", "stage 1 runs forward(0) before receiving its input"),
    ],
)
def test_schedule_problem_names_the_mistake(stage, actions, problem):
    good = one_f_one_b_actions(stage, 2, 3)
    wrong = {
        "missing send": _without(good, ("send_gradient", 2)),
        "double send": good + [("send_activation", 0)],
        "last sends": good + [("send_activation", 0)],
        "backward first": [("backward", 0)] + _without(good, ("backward", 0)),
        "not a list": tuple(good),
        "compute in group": [[("forward", 0), ("send_activation", 0)]],
        "bad index": good + [("forward", 3)],
        "early use": [("forward", 0)] + _without(good, ("forward", 0)),
    }[actions]
    assert schedule_problem(stage, 2, 3, wrong).startswith(problem)
