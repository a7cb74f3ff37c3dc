"""Two nodes on this machine train like one node of four (notebook 11)."""

from multigpu import faults
from multigpu.ranks.snapshot import snapshot_rank
from multigpu.runtime.launch import spawn
from tests.snapshot.problem import EVERY, script_problem, weights_equal

RUN_TIMEOUT = 240.0  # one torchrun run on a busy 2-core machine


def test_two_nodes_of_two_train_like_one_node_of_four(folder, tmp_path_factory):
    script = ["--samples", 256, "--epochs", 2, "--float64", "--no-progress"]
    outputs = faults.run_nodes(
        "--snapshot", folder, "--show-ranks", *script, timeout=RUN_TIMEOUT
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
