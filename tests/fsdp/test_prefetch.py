"""issue_with_prefetch issues the unit's own all-gather first, then the next
``depth`` units' without waiting, and waits for its own only."""

import pytest

from multigpu.fsdp import issue_with_prefetch


class Calls:
    """Records issue_gather and wait calls in order."""

    def __init__(self, depth):
        self.depth, self.calls = depth, []

    def issue_gather(self, unit):
        self.calls.append(("issue", unit))
        calls = self.calls

        class Handle:
            def wait(self):
                calls.append(("wait", unit))

        return Handle()


@pytest.mark.parametrize(
    "depth,position,expected",
    [
        (0, 1, [("issue", 7), ("wait", 7)]),
        (2, 0, [("issue", 9), ("issue", 7), ("issue", 8), ("wait", 9)]),
        (2, 2, [("issue", 8), ("wait", 8)]),  # the last unit: nothing ahead
    ],
)
def test_prefetch_issues_the_window_and_waits_for_its_own(depth, position, expected):
    fsdp = Calls(depth)
    issue_with_prefetch(fsdp, [9, 7, 8], position)
    assert fsdp.calls == expected
