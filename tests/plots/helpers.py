"""Shared by the tests of multigpu.plots."""


def bar_patches(ax):
    """(category, bar index) -> the bar's patch."""
    return {
        (container.get_label(), round(patch.get_x() + patch.get_width() / 2)): patch
        for container in ax.containers
        for patch in container
    }
