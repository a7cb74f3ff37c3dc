"""Figures: learning curves (01), DataParallel's data flow (02), per-device memory
and timelines (03, 06), the ring all-reduce step by step (07), DDP's overlap and
buckets (10), the scaling model (12), what each rank of a ZeRO stage holds and
DTensor's placements (13), a unit's life and the prefetch (14), HSDP's mesh (14b),
tensor and sequence parallel's cuts and a 2-D mesh (15), pipeline schedules (16),
ring attention's steps, its backward, the zig-zag and Ulysses layouts (17), the
tokens' routing, the all-to-all's send table and the load per expert (18), the rank
grid and pipeline plans with their bubbles (19), the planner's configurations and
the kinds of memory of a Llama-shaped step (20).

Every plot_ function returns a matplotlib Figure; in a notebook it is shown once.
One file per lesson family; ``from multigpu.plots import plot_x`` gives them all.
"""

from multigpu.plots.cluster import plot_cluster_plans, plot_memory_kinds
from multigpu.plots.collectives import plot_ring, ring_states
from multigpu.plots.context_parallel import (
    plot_layouts,
    plot_ring_backward,
    plot_ring_steps,
    plot_ulysses_layout,
)
from multigpu.plots.dataparallel import (
    plot_dataparallel_flow,
    plot_memory,
    plot_timeline,
)
from multigpu.plots.ddp import plot_buckets, plot_overlap
from multigpu.plots.dtensor import plot_mesh, plot_placements
from multigpu.plots.expert_parallel import (
    plot_load_balance,
    plot_send_table,
    plot_token_routing,
)
from multigpu.plots.fsdp import plot_prefetch, plot_unit_life
from multigpu.plots.fsdp2 import plot_hsdp_mesh
from multigpu.plots.gpt4d import plot_grid, plot_pipeline_plans
from multigpu.plots.pipeline import plot_bubble, plot_schedules
from multigpu.plots.scaling import plot_alpha_beta_fit, plot_speedups
from multigpu.plots.tensor_parallel import (
    plot_2d_mesh,
    plot_column_row_cut,
    plot_sequence_parallel,
)
from multigpu.plots.training import plot_history
from multigpu.plots.zero import LEDGER_COLOURS, plot_zero_ledgers

__all__ = [
    "LEDGER_COLOURS",
    "plot_2d_mesh",
    "plot_alpha_beta_fit",
    "plot_bubble",
    "plot_buckets",
    "plot_cluster_plans",
    "plot_column_row_cut",
    "plot_dataparallel_flow",
    "plot_grid",
    "plot_history",
    "plot_hsdp_mesh",
    "plot_layouts",
    "plot_load_balance",
    "plot_memory",
    "plot_memory_kinds",
    "plot_mesh",
    "plot_overlap",
    "plot_pipeline_plans",
    "plot_placements",
    "plot_prefetch",
    "plot_ring",
    "plot_ring_backward",
    "plot_ring_steps",
    "plot_schedules",
    "plot_send_table",
    "plot_sequence_parallel",
    "plot_speedups",
    "plot_timeline",
    "plot_token_routing",
    "plot_ulysses_layout",
    "plot_unit_life",
    "plot_zero_ledgers",
    "ring_states",
]
