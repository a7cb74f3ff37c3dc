"""Tests of plot_alpha_beta_fit and plot_speedups (12)."""

from multigpu import plots


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
