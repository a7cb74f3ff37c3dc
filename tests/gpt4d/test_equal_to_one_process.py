"""Every grid trains the tiny GPT as one process does: 3 SGD steps on uneven
batches, float64 within 1e-10, float32 within 1e-5; PyTorch's version (FSDP2 x
parallelize_module x pipelining on one DeviceMesh) too, and equal to the hand-built
one; the loss each last stage reports is one process's."""

import pytest

from tests.gpt4d.conftest import FULL_16, GRIDS_8, TORCH_GRIDS

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def _select(runs, grid, dtype, version):
    chosen = [
        r for r in runs if r.grid == grid and r.dtype == dtype and r.version == version
    ]
    assert len(chosen) == grid.world_size  # every rank reported
    return chosen


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("grid", GRIDS_8, ids=lambda g: g.label())
def test_hand_built_grids_equal_one_process(eight_rank_runs, grid, dtype):
    runs = _select(eight_rank_runs, grid, dtype, "hand")
    assert max(r.max_diff for r in runs) < TOLERANCE[dtype]
    reported = [r for r in runs if r.losses[0] is not None]
    assert len(reported) == grid.world_size // grid.pp  # the last stage's ranks
    for run in reported:
        for loss, expected in zip(run.losses, run.reference_losses, strict=True):
            assert loss == pytest.approx(expected, abs=TOLERANCE[dtype] * 100)


@pytest.mark.parametrize("grid", TORCH_GRIDS, ids=lambda g: g.label())
def test_torch_api_grids_equal_one_process_and_the_hand_built(eight_rank_runs, grid):
    runs = _select(eight_rank_runs, grid, "float64", "both")
    assert max(r.max_diff for r in runs) < 1e-10
    assert max(r.versions_diff for r in runs) < 1e-10
    for run in runs:
        if run.losses[0] is not None:
            assert run.losses == pytest.approx(run.reference_losses, abs=1e-10)


def test_every_dimension_is_in_some_eight_rank_grid_of_each_version():
    for grids in (GRIDS_8, TORCH_GRIDS):
        for dim in ("dp", "tp", "pp", "cp"):
            assert any(getattr(grid, dim) == 2 for grid in grids), dim


def test_the_full_two_by_two_by_two_by_two_equals_one_process(sixteen_rank_runs):
    runs = _select(sixteen_rank_runs, FULL_16, "float64", "hand")
    assert max(r.max_diff for r in runs) < 1e-10
    assert {tuple(r.coords.values()) for r in runs} == {
        (d, p, c, t) for d in (0, 1) for p in (0, 1) for c in (0, 1) for t in (0, 1)
    }
