"""Tests of ring_states and plot_ring (07)."""

import matplotlib.pyplot as plt


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
