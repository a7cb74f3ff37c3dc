"""Expert parallelism: a mixture-of-experts layer whose experts live on different
ranks, tokens dispatched and combined with all-to-all, by hand (18).

Taught in ``notebooks/18_expert_parallel.ipynb``. A router sends each token to
its top-k experts; expert parallelism gives each rank E/ep of the E experts and
moves the tokens to them and the outputs back, with two all-to-alls whose split
sizes differ on every rank and every step:

- :mod:`~multigpu.expert_parallel.routing`: top-k softmax gates, the capacity and
  dropped tokens, the Switch Transformer's load-balancing loss;
- :mod:`~multigpu.expert_parallel.layer`: the layer in one process (with its
  residual path for dropped tokens) and a small model around it;
- :mod:`~multigpu.expert_parallel.alltoall`: an all-to-all autograd follows, and
  the bytes it sends;
- :mod:`~multigpu.expert_parallel.dispatch`: the counts exchanged first, dispatch
  and combine;
- :mod:`~multigpu.expert_parallel.parallel`: the layer on ranks;
- :mod:`~multigpu.expert_parallel.training`: EP x DP, which gradient is summed
  over which group, training steps equal to one process;
- :mod:`~multigpu.expert_parallel.equality`: the cases run on ranks and compared
  with one process;
- :mod:`~multigpu.expert_parallel.costs`: the bytes as formulas;
- :mod:`~multigpu.expert_parallel.load`: tokens per expert and per rank.

The ranks and launchers are in :mod:`multigpu.ranks.expert_parallel`, the figures
in :mod:`multigpu.plots.expert_parallel`, the exercise's checker is
:func:`multigpu.exercises.expert_parallel.check_dispatch_combine`.
"""

from multigpu.expert_parallel.alltoall import (
    AllToAll,
    AllToAllRecord,
    all_to_all,
    exchange_rows,
)
from multigpu.expert_parallel.costs import (
    COUNT_BYTES,
    all_to_all_bytes,
    balanced_all_to_all_bytes,
    break_even_tokens,
    capped_all_to_all_bytes,
    replicated_experts_bytes,
)
from multigpu.expert_parallel.dispatch import (
    DispatchPlan,
    combine,
    dispatch,
    exchange_counts,
    experts_per_rank,
    inverse_permutation,
)
from multigpu.expert_parallel.equality import (
    EPDPCase,
    LayerCase,
    ep_dp_differences,
    ep_dp_on_rank,
    layer_differences,
    layer_in_one_process,
    layer_on_rank,
    merge_parameters,
    random_layer_case,
    steered_layer_case,
)
from multigpu.expert_parallel.layer import (
    Expert,
    MoELayer,
    MoEModel,
    MoEOutput,
    kept_choices,
    make_moe_classifier,
    moe_loss,
    steered_tokens,
)
from multigpu.expert_parallel.load import imbalance, load_table, tokens_per_rank
from multigpu.expert_parallel.parallel import (
    ExpertParallelMoE,
    is_expert_parameter,
    shard_experts,
)
from multigpu.expert_parallel.routing import (
    Routing,
    expert_capacity,
    load_balancing_loss,
    route,
)
from multigpu.expert_parallel.training import (
    EPLayout,
    RankGroups,
    StepHistory,
    all_reduce_gradients,
    assemble_start,
    make_groups,
    sgd_step,
    sync_start,
    train_ep_dp,
    train_one_process,
)

__all__ = [
    "COUNT_BYTES",
    "AllToAll",
    "AllToAllRecord",
    "DispatchPlan",
    "EPDPCase",
    "EPLayout",
    "Expert",
    "ExpertParallelMoE",
    "LayerCase",
    "MoELayer",
    "MoEModel",
    "MoEOutput",
    "RankGroups",
    "Routing",
    "StepHistory",
    "all_reduce_gradients",
    "all_to_all",
    "all_to_all_bytes",
    "assemble_start",
    "balanced_all_to_all_bytes",
    "break_even_tokens",
    "capped_all_to_all_bytes",
    "combine",
    "dispatch",
    "ep_dp_differences",
    "ep_dp_on_rank",
    "exchange_counts",
    "exchange_rows",
    "expert_capacity",
    "experts_per_rank",
    "imbalance",
    "inverse_permutation",
    "is_expert_parameter",
    "kept_choices",
    "layer_differences",
    "layer_in_one_process",
    "layer_on_rank",
    "load_balancing_loss",
    "load_table",
    "make_groups",
    "make_moe_classifier",
    "merge_parameters",
    "moe_loss",
    "random_layer_case",
    "replicated_experts_bytes",
    "route",
    "sgd_step",
    "steered_layer_case",
    "steered_tokens",
    "shard_experts",
    "sync_start",
    "tokens_per_rank",
    "train_ep_dp",
    "train_one_process",
]
