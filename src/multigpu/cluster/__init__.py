"""A cluster on a laptop: many ranks in one process, a real model's memory without
its memory, and a planner (20).

Taught in ``notebooks/20_plan_a_cluster_job.ipynb``. The private torch APIs used
here are pinned (:mod:`~multigpu.cluster.pin`).

- :mod:`~multigpu.cluster.fake`: the fake process group and ``CommDebugMode``;
- :mod:`~multigpu.cluster.threaded`: real ranks as threads (exact collectives);
- :mod:`~multigpu.cluster.local`: LocalTensor, every rank's value in one tensor;
- :mod:`~multigpu.cluster.support`: what each of the three runs, found live;
- :mod:`~multigpu.cluster.llama`: Llama-3-8B- and 70B-shaped models;
- :mod:`~multigpu.cluster.memory`: PyTorch's memory tracker on a fake mesh;
- :mod:`~multigpu.cluster.planner`: the DP/TP/PP/CP configurations that fit.
"""

from multigpu.cluster.fake import count_collectives, fake_world, mlp_step_collectives
from multigpu.cluster.llama import LLAMA3_8B, LLAMA3_70B, Llama, LlamaShape
from multigpu.cluster.local import (
    local_all_reduce,
    local_fsdp2_error,
    local_tp_difference,
)
from multigpu.cluster.memory import (
    MOMENTS,
    measure_llama,
    saved_in_one_block,
    tool_against_formula,
)
from multigpu.cluster.pin import TAUGHT_ON, check_torch_version
from multigpu.cluster.planner import (
    H100_BF16_FLOPS,
    H100_NODE,
    Plan,
    plan_configurations,
    predicted_memory,
    valid_grids,
)
from multigpu.cluster.support import support_table
from multigpu.cluster.threaded import run_threaded

__all__ = [
    "H100_BF16_FLOPS",
    "H100_NODE",
    "LLAMA3_70B",
    "LLAMA3_8B",
    "MOMENTS",
    "TAUGHT_ON",
    "Llama",
    "LlamaShape",
    "Plan",
    "check_torch_version",
    "count_collectives",
    "fake_world",
    "local_all_reduce",
    "local_fsdp2_error",
    "local_tp_difference",
    "measure_llama",
    "mlp_step_collectives",
    "plan_configurations",
    "predicted_memory",
    "run_threaded",
    "saved_in_one_block",
    "support_table",
    "tool_against_formula",
    "valid_grids",
]
