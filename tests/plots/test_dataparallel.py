"""Tests of plot_memory and plot_timeline (03, 06)."""

import matplotlib.pyplot as plt

from tests.plots.helpers import bar_patches


def test_memory_bars_stack_each_devices_bytes():
    from multigpu.plots import plot_memory

    mib = 2**20
    ledger = {
        "gpu:0": {"parameters": 2 * mib, "gathered": 1 * mib},
        "gpu:1": {"parameters": 2 * mib},
    }
    fig = plot_memory(ledger)
    ax, extra = fig.axes
    bars = bar_patches(ax)
    assert bars[("parameters", 0)].get_height() == 2.0  # MiB
    assert bars[("gathered", 0)].get_y() == 2.0  # stacked on top of the weights
    assert bars[("gathered", 1)].get_height() == 0.0  # nothing gathered on gpu:1
    assert ax.get_ylabel() == "MiB"
    # the second panel: what each device holds beyond the device with least
    extra_bars = bar_patches(extra)
    assert set(extra_bars) == {("gathered", 0), ("gathered", 1)}  # same weights
    assert extra_bars[("gathered", 0)].get_height() == 1.0
    legend = [text.get_text() for text in extra.get_legend().get_texts()]
    assert legend == ["gathered", "parameters"]  # top of the stack first
    plt.close(fig)


def test_memory_extra_panel_has_its_own_scale_and_the_peaks():
    from multigpu.plots import plot_memory

    kib, mib = 2**10, 2**20
    ledger = {  # a small extra on gpu:0 next to a large common part
        "gpu:0": {"activations": 8 * mib + 40 * kib, "gradients": 6 * kib},
        "gpu:1": {"activations": 8 * mib, "gradients": 0},
        "gpu:2": {"activations": 8 * mib, "gradients": 0},
    }
    peak = {"gpu:0": 9 * mib + 10 * kib, "gpu:1": 9 * mib, "gpu:2": 9 * mib}
    ax, extra = plot_memory(ledger, peak=peak).axes
    assert ax.get_ylabel() == "MiB" and extra.get_ylabel() == "KiB"
    extra_bars = bar_patches(extra)
    assert extra_bars[("activations", 0)].get_height() == 40.0
    assert extra_bars[("gradients", 0)].get_y() == 40.0
    assert extra_bars[("activations", 1)].get_height() == 0.0
    # the measured peaks, as black lines: in MiB, then beyond the smallest, in KiB
    [marks] = ax.collections
    assert [round(y, 4) for y in marks.get_offsets()[:, 1]] == [9.0098, 9.0, 9.0]
    [extra_marks] = extra.collections
    assert list(extra_marks.get_offsets()[:, 1]) == [10.0, 0.0, 0.0]
    legend = [text.get_text() for text in extra.get_legend().get_texts()]
    assert legend == ["gradients", "activations", "measured peak"]
    plt.close("all")


def test_timeline_has_one_lane_per_device_and_bars_where_events_are():
    from multigpu.dataparallel import DeviceEvent
    from multigpu.plots import plot_timeline

    events = [
        DeviceEvent("gpu:0", "forward", 0.001, 0.003),
        DeviceEvent("gpu:1", "forward", 0.001, 0.002),
        DeviceEvent("gpu:0", "gather", 0.004, 0.005),
    ]
    ax = plot_timeline(events).axes[0]
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["gpu:0", "gpu:1"]
    spans = sorted(
        (round(path.vertices[:, 0].min(), 6), round(path.vertices[:, 0].max(), 6))
        for collection in ax.collections
        for path in collection.get_paths()
    )
    assert spans == [(1.0, 2.0), (1.0, 3.0), (4.0, 5.0)]  # milliseconds
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == ["forward", "gather"]


def test_timeline_lanes_follow_device_numbers():
    from multigpu.dataparallel import DeviceEvent
    from multigpu.plots import plot_timeline

    names = ["gpu:10", "gpu:2", "gpu:0"]
    ax = plot_timeline([DeviceEvent(n, "forward", 0.0, 0.001) for n in names]).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu:0", "gpu:2", "gpu:10"]


def test_a_recorded_one_device_step_draws_one_lane_and_one_bar():
    import matplotlib.pyplot as plt
    import torch

    from multigpu import dataparallel as dp
    from multigpu.core.devices import simulated_devices
    from multigpu.plots import plot_memory, plot_timeline

    torch.manual_seed(0)
    devices = simulated_devices(1)
    model = dp.to_device(torch.nn.Linear(3, 2), devices[0])
    X, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    _, recorder = dp.record_step(dp.DataParallel(model, devices), X, y)
    timeline = plot_timeline(recorder.events).axes[0]
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["gpu:0"]
    legend = [text.get_text() for text in timeline.get_legend().get_texts()]
    assert legend == ["scatter", "forward", "loss", "backward"]
    memory = plot_memory(recorder.ledger).axes[0]
    assert [t.get_text() for t in memory.get_xticklabels()] == ["gpu:0"]
    plt.close("all")
