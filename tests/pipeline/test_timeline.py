"""Tests for multigpu.pipeline.timeline on blocks worked out by hand."""

import pytest

from multigpu.pipeline import ScheduleBlock, bubble_fraction, busy_time, step_span


def test_bubble_of_two_stages_by_hand():
    blocks = [
        ScheduleBlock(0, "forward", 0, 0.0, 1.0),
        ScheduleBlock(1, "forward", 0, 1.0, 2.0),
        ScheduleBlock(1, "backward", 0, 2.0, 4.0),
        ScheduleBlock(0, "backward", 0, 4.0, 6.0),
    ]
    assert step_span(blocks) == (0.0, 6.0)
    assert busy_time(blocks, 0) == busy_time(blocks, 1) == 3.0
    assert bubble_fraction(blocks, 2) == pytest.approx(0.5)  # (p-1)/(m+p-1), m=1
