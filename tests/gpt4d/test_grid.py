"""The rank grid: coordinates and ranks invert each other, groups split the world
along each dimension (tp neighbours), the tied group is a pipeline's two ends, and
an impossible grid gets one line that names what is wrong."""

import pytest

from multigpu.gpt4d.config import GPTConfig
from multigpu.gpt4d.grid import DIMS, Grid, grid_problem

GRIDS = (Grid(dp=2, tp=2, pp=2), Grid(dp=3, tp=2, pp=2, cp=2), Grid(), Grid(pp=4))


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: g.label())
def test_coordinates_and_ranks_invert_each_other(grid):
    seen = set()
    for rank in range(grid.world_size):
        coords = grid.coords(rank)
        assert grid.rank_of(**coords) == rank
        assert all(0 <= coords[d] < getattr(grid, d) for d in DIMS)
        seen.add(tuple(coords.values()))
    assert len(seen) == grid.world_size


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: g.label())
@pytest.mark.parametrize("dim", DIMS)
def test_groups_split_the_world_and_differ_only_along_their_dimension(grid, dim):
    groups = grid.groups(dim)
    members = sorted(r for g in groups for r in g)
    assert members == list(range(grid.world_size))
    for group in groups:
        coords = [grid.coords(r) for r in group]
        assert [c[dim] for c in coords] == list(range(getattr(grid, dim)))
        others = {tuple(c[d] for d in DIMS if d != dim) for c in coords}
        assert len(others) == 1


def test_tensor_parallel_ranks_are_neighbours_and_dp_the_farthest():
    grid = Grid(dp=2, tp=2, pp=2)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_the_tied_group_is_each_pipelines_first_and_last_stage():
    grid = Grid(tp=2, pp=4)
    assert grid.tied_groups() == [[0, 6], [1, 7]]
    assert Grid(tp=2).tied_groups() == [[0], [1]]


def test_a_grid_that_works_has_no_problem():
    assert grid_problem(Grid(dp=2, tp=2, pp=2), 8, GPTConfig(), 6, 2) is None


@pytest.mark.parametrize(
    ("grid", "world_size", "config", "batch", "words"),
    [
        (
            Grid(dp=2, tp=2),
            8,
            GPTConfig(),
            0,
            "dp*tp*pp*cp = 2*2*1*1 = 4, but the world has 8",
        ),
        (Grid(tp=4), 4, GPTConfig(heads=2), 0, "heads 2 is not divisible by tp 4"),
        (Grid(pp=3), 3, GPTConfig(layers=2), 0, "layers 2 is not divisible by pp 3"),
        (Grid(cp=3), 3, GPTConfig(seq_len=8), 0, "seq_len 8 is not divisible by cp 3"),
        (
            Grid(dp=4),
            4,
            GPTConfig(),
            6,
            "a batch of 6 sequences cannot give each of dp 4",
        ),
        (Grid(dp=0), 0, GPTConfig(), 0, "--dp is 0"),
    ],
)
def test_an_impossible_grid_is_one_line_naming_the_problem(
    grid, world_size, config, batch, words
):
    problem = grid_problem(grid, world_size, config, batch, 2)
    assert words in problem
    assert "\n" not in problem
    assert ";" in problem  # what is wrong; how to fix it
