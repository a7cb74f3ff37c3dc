"""Tests for multigpu.ranks.dtensor: the DTensor primer of notebook 13 on real ranks
(gloo): what each rank holds, and which collective each redistribute runs."""

from multigpu.ranks import dtensor as dtensor_ranks
from multigpu.runtime.launch import spawn


def test_shard_and_replicate_hold_chunks_and_everything():
    results = spawn(dtensor_ranks.placements_rank, 4, 10)
    chunks = [r["local"]["Shard(0)"] for r in results]
    assert chunks == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]  # torch.chunk's cut
    for result in results:
        assert result["global shape"] == (10,)
        assert result["placements"] == {"Shard(0)": "S(0)", "Replicate()": "R"}
        assert result["local"]["Replicate()"] == list(range(10))
        assert result["local"]["S(0) -> R"] == list(range(10))
        assert result["collectives"]["S(0) -> R"] == {"all_gather_into_tensor": 1}
        assert result["collectives"]["R -> S(0)"] == {}  # each rank keeps its chunk
    assert [r["local"]["R -> S(0)"] for r in results] == chunks


def test_a_split_matmul_is_partial_until_reduced():
    results = spawn(dtensor_ranks.partial_rank, 4)
    expected = [[80.0, 90.0, 100.0, 110.0]]
    partials = [r["local"]["Partial()"][0] for r in results]
    assert [sum(column) for column in zip(*partials)] == expected[0]
    assert partials[1] == [8.0, 10.0, 12.0, 14.0]  # x[1] = 2 times w's row 1
    for rank, result in enumerate(results):
        assert result["placement"] == "P(sum)"
        assert result["x @ w"] == expected
        assert result["local"]["P -> R"] == expected
        assert result["local"]["P -> S(1)"] == [[expected[0][rank]]]
        assert result["collectives"] == {
            "x @ w": {},
            "P -> R": {"all_reduce": 1},
            "P -> S(1)": {"reduce_scatter_tensor": 1},
        }


def test_a_2d_mesh_has_rows_and_columns_as_groups():
    results = spawn(dtensor_ranks.mesh_2d_rank, 4, (2, 2), ("replicate", "shard"))
    assert [r["coordinate"] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["groups"]["shard"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["groups"]["replicate"] for r in results] == [
        [0, 2],
        [1, 3],
        [0, 2],
        [1, 3],
    ]
    assert all(r["mesh"] == [[0, 1], [2, 3]] for r in results)
    assert all(r["placements"] == ["R", "S(0)"] for r in results)
    halves = [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert [r["local"] for r in results] == [halves[0], halves[1]] * 2
