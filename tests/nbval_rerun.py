"""A pytest plugin for nbval: after a notebook's cells have run and been checked, run
every code cell once more, in reverse order, in the same kernel.

Learners go back to a cell after Run All; each cell then sees what the cells after it
left. A re-run cell may not fail unless it is meant to (``# NBVAL_RAISES_EXCEPTION``
or the ``raises-exception`` tag, which nbval already honours); its outputs are not
compared (a re-run may print other numbers), and a cell nbval skips is skipped again.
Because the check reuses the kernel of nbval's own pass, a notebook runs once more,
not twice more. ``make nbval`` turns it on for its first pass::

    python -m pytest -p tests.nbval_rerun --nbval-rerun --nbval ... NOTEBOOKS

The re-run items are named ``Cell N re-run``, after nbval's ``Cell N``.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from nbval.plugin import IPyNbCell


def pytest_addoption(parser) -> None:
    parser.getgroup("nbval").addoption(
        "--nbval-rerun",
        action="store_true",
        help="after each notebook, run every code cell again in reverse order "
        "(tests/nbval_rerun.py)",
    )


class ReRunCell(IPyNbCell):
    """A code cell run again after the whole notebook; reported as ``Cell N re-run``."""

    def reportinfo(self):
        path, line, description = super().reportinfo()
        return path, line, f"{description} re-run"


def _rerun_items(cells: list[IPyNbCell]) -> list[ReRunCell]:
    reruns = []
    for cell in reversed(cells):
        options = copy.copy(cell.options)  # nbval's defaultdict(bool)
        options["check"] = False  # errors count, outputs are not compared
        rerun = ReRunCell.from_parent(
            cell.parent,
            name=f"{cell.name} re-run",
            cell_num=cell.cell_num,
            cell=cell.cell,
            options=options,
        )
        reruns.append(rerun)
    return reruns


def _notebook_of(item: pytest.Item):
    """The notebook a cell item belongs to; None for any other test."""
    return item.parent if isinstance(item, IPyNbCell) else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    if not config.getoption("nbval_rerun"):
        return
    ordered = []
    for notebook, run in itertools.groupby(items, key=_notebook_of):
        run = list(run)
        ordered += run if notebook is None else run + _rerun_items(run)
    items[:] = ordered
