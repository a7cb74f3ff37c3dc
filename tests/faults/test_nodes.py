"""Two nodes on this machine train like one node of four (notebook 11); the
launchers of notebook 11 take a deadline, not a timeout."""

import pytest

from multigpu import faults
from multigpu.ranks.snapshot import snapshot_rank
from multigpu.runtime.launch import spawn
from tests.snapshot.problem import EVERY, script_problem, weights_equal

RUN_TIMEOUT = 240.0  # one torchrun run on a busy 2-core machine


def test_two_nodes_of_two_train_like_one_node_of_four(folder, tmp_path_factory):
    script = ["--samples", 256, "--epochs", 2, "--float64", "--show-ranks"]
    outputs = faults.run_nodes(
        "--snapshot", folder, *script, module=faults.MODULE, deadline=RUN_TIMEOUT
    )
    table = faults.rank_table_lines(outputs)
    assert table[0] == "RANK | LOCAL_RANK | GROUP_RANK | LOCAL_WORLD_SIZE | WORLD_SIZE"
    assert table[1:] == [f"{r} | {r % 2} | {r // 2} | 2 | 4" for r in range(4)]
    model, X, y, config = script_problem(samples=256, epochs=2)
    reference = str(tmp_path_factory.mktemp("one_node"))
    one_node = spawn(
        snapshot_rank, 4, model, X, y, config, reference, EVERY, timeout=60
    )
    weights_equal(faults.final_weights(folder), one_node[0].parameters)


@pytest.mark.parametrize(
    "launch",
    [faults.run_nodes, faults.run_with_restarts, faults.kill_rank_from_outside],
)
def test_the_launchers_of_11_take_a_deadline_not_a_timeout(launch, tmp_path):
    with pytest.raises(TypeError) as refused:  # before anything starts
        launch(tmp_path, timeout=5)
    assert str(refused.value).endswith("Pass deadline=5 instead of timeout=5.")
    assert "takes deadline=, not timeout=" in str(refused.value)
