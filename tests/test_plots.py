import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from multigpu import plots  # noqa: E402
from multigpu.core.train import History  # noqa: E402
from multigpu.plots import plot_history  # noqa: E402


def test_history_plot_has_loss_and_accuracy_panels():
    history = History([2.0, 1.0], [1.5, 0.9], [0.5, 0.8], [0.1, 0.1])
    fig = plot_history(history, title="baseline")
    loss_ax, acc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.lines] == ["train", "test"]
    assert list(acc_ax.lines[0].get_ydata()) == [50.0, 80.0]
    assert fig._suptitle.get_text() == "baseline"


def test_several_runs_are_labelled():
    runs = {
        "1 device": History([1.0], [], [], [0.1]),
        "2 devices": History([0.9], [], [], [0.1]),
    }
    fig = plot_history(runs)
    assert [line.get_label() for line in fig.axes[0].lines] == [
        "1 device train",
        "2 devices train",
    ]
    assert len(fig.axes[1].lines) == 0


def _bars(ax):
    """(category, bar index) -> the bar's patch."""
    return {
        (container.get_label(), round(patch.get_x() + patch.get_width() / 2)): patch
        for container in ax.containers
        for patch in container
    }


def test_memory_bars_stack_each_devices_bytes():
    from multigpu.plots import plot_memory

    mib = 2**20
    ledger = {
        "gpu:0": {"parameters": 2 * mib, "gathered": 1 * mib},
        "gpu:1": {"parameters": 2 * mib},
    }
    fig = plot_memory(ledger)
    ax, extra = fig.axes
    bars = _bars(ax)
    assert bars[("parameters", 0)].get_height() == 2.0  # MiB
    assert bars[("gathered", 0)].get_y() == 2.0  # stacked on top of the weights
    assert bars[("gathered", 1)].get_height() == 0.0  # nothing gathered on gpu:1
    assert ax.get_ylabel() == "MiB"
    # the second panel: what each device holds beyond the device with least
    extra_bars = _bars(extra)
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
    extra_bars = _bars(extra)
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
    from multigpu.dataparallel import Event
    from multigpu.plots import plot_timeline

    events = [
        Event("gpu:0", "forward", 0.001, 0.003),
        Event("gpu:1", "forward", 0.001, 0.002),
        Event("gpu:0", "gather", 0.004, 0.005),
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
    from multigpu.dataparallel import Event
    from multigpu.plots import plot_timeline

    names = ["gpu:10", "gpu:2", "gpu:0"]
    ax = plot_timeline([Event(n, "forward", 0.0, 0.001) for n in names]).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu:0", "gpu:2", "gpu:10"]


def test_ring_states_end_with_every_rank_holding_all_data():
    from multigpu.plots import ring_states

    for world_size in (1, 2, 3, 4):
        states = ring_states(world_size)
        assert len(states) == 2 * (world_size - 1) + 1
        everyone = set(range(world_size))
        assert all(h == everyone for row in states[-1]["holds"] for h in row)
        if world_size > 1:  # after reduce-scatter rank r owns chunk r + 1
            middle = states[world_size - 1]["holds"]
            for rank in range(world_size):
                assert middle[rank][(rank + 1) % world_size] == everyone
    first = ring_states(4)[0]
    assert first["sends"] == [0, 1, 2, 3]  # each rank starts with its own chunk
    assert first["holds"][2] == [{2}] * 4  # before any message: only its own data


def test_plot_ring_draws_one_panel_per_step_with_the_sent_chunks_boxed():
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from multigpu.plots import plot_ring

    figure = plot_ring(3)
    assert len(figure.axes) == 2 * (3 - 1) + 1
    assert figure.axes[0].get_title() == "reduce-scatter step 1"
    assert figure.axes[-1].get_title() == "done"
    boxes = [
        [p for p in axis.patches if isinstance(p, Rectangle)] for axis in figure.axes
    ]
    assert [len(b) for b in boxes] == [3, 3, 3, 3, 0]  # one per rank, none when done
    labels = {text.get_text() for text in figure.axes[-1].texts}
    assert labels == {"012"}  # every chunk on every rank holds the full sum
    plt.close(figure)


def test_plot_ring_fits_a_notebook_with_one_phase_per_row():
    import matplotlib.pyplot as plt

    from multigpu.plots import plot_ring

    figure = plot_ring(4)
    width, height = figure.get_size_inches()
    assert width <= 9.5 and height <= 5  # a notebook shows about 9 inches at 100 dpi
    rows = {}
    for axis in figure.axes:  # panels of one phase share a row, top to bottom
        rows.setdefault(round(axis.get_position().y0, 2), []).append(axis.get_title())
    top, bottom = (rows[y] for y in sorted(rows, reverse=True))
    assert top == [f"reduce-scatter step {s}" for s in (1, 2, 3)]
    assert bottom == [f"all-gather step {s}" for s in (1, 2, 3)] + ["done"]
    assert "rank 3 sends to rank 0" in figure.texts[0].get_text()  # the key
    smallest = min(t.get_fontsize() for axis in figure.axes for t in axis.texts)
    assert smallest >= 9
    plt.close(figure)


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


def test_plot_alpha_beta_fit_draws_points_and_a_line_per_world_size():
    rows = {
        n: [{"bytes": s, "seconds": 1e-4 * n + s / 1e9} for s in (1024, 1 << 20)]
        for n in (2, 4)
    }
    fig = plots.plot_alpha_beta_fit(rows, {2: (5e-5, 1e9), 4: (1e-4, 1e9)})
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4  # points and fitted line for each world size
    assert any("α = 50 µs" in line.get_label() for line in lines)


def test_plot_speedups_draws_the_ideal_and_each_curve():
    fig = plots.plot_speedups(
        {"a": ([1, 2, 4], [1.0, 1.9, 3.5]), "b": ([1, 8], [1, 6])}
    )
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["ideal (N)", "a", "b"]


def test_zero_ledgers_stack_each_category_in_one_panel_per_title():
    ledger = {"parameters": 4.0, "gradients": 4.0, "optimizer": 8.0, "gathered": 0.0}
    sharded = {"parameters": 1.0, "gradients": 1.0, "optimizer": 2.0, "gathered": 3.0}
    fig = plots.plot_zero_ledgers(
        {
            "1 rank": {"DDP": ledger},
            "4 ranks": {"DDP": ledger, "ZeRO-3": sharded},
        },
        ylabel="bytes per parameter",
    )
    one, four = fig.axes
    assert [ax.get_title() for ax in fig.axes] == ["1 rank", "4 ranks"]
    assert [t.get_text() for t in four.get_xticklabels()] == ["DDP", "ZeRO-3"]
    bars = _bars(four)
    assert bars[("optimizer", 0)].get_height() == 8.0
    assert bars[("optimizer", 0)].get_y() == 8.0  # on parameters and gradients
    assert bars[("gathered", 1)].get_y() == 4.0  # ZeRO-3: 1 + 1 + 2 below it
    assert bars[("gathered", 1)].get_height() == 3.0
    assert one.get_ylabel() == "bytes per parameter"
    assert four.get_shared_y_axes().joined(one, four)  # one scale for all panels
    legend = [t.get_text() for t in four.get_legend().get_texts()]
    assert legend == ["parameters", "gradients", "optimizer", "gathered"]
    plt.close("all")


def test_plot_buckets_draws_one_bar_per_bucket():
    layout = [["b", "a"], ["c"]]
    fig = plots.plot_buckets(layout, {"a": 4096, "b": 1024, "c": 2048})
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["bucket 0", "bucket 1"]
    assert len(fig.axes[0].patches) == 3


def test_plot_overlap_draws_a_compute_and_a_communication_lane_per_rank():
    from multigpu.miniddp import Event

    rank = [
        Event("backward", "layer 1", 0.0, 1.0),
        Event("backward", "layer 0", 1.0, 2.0),
        Event("all-reduce", "bucket 0", 1.0, 2.5),
    ]
    fig = plots.plot_overlap({"flat": [rank, rank], "bucketed": [rank, rank]})
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "rank 0 backward",
        "rank 0 all-reduce",
        "rank 1 backward",
        "rank 1 all-reduce",
    ]
    # one span per event: 3 events on each of 2 ranks, in milliseconds
    spans = [c.get_paths()[0].get_extents() for c in fig.axes[0].collections]
    assert len(spans) == 6
    assert sorted({(round(b.x0), round(b.x1)) for b in spans}) == [
        (0, 1000),
        (1000, 2000),
        (1000, 2500),
    ]
