"""The cost model: what moving data costs in data-parallel training (07, 12, 13).

Taught in ``notebooks/07_collectives_from_scratch.ipynb``, next to the bytes and
times measured with :mod:`multigpu.collectives`; notebook 12 extends it into the
cost model of data-parallel training, and notebook 13 adds the memory and traffic
of the ZeRO stages. One file per concept, every name importable from here
(``costmodel.ddp_step``):

- :mod:`~multigpu.costmodel.communication`: bytes each rank sends in an all-reduce,
  the α-β time model, nccl-tests' bus bandwidth (07);
- :mod:`~multigpu.costmodel.fit`: α and B fitted to measured all-reduce times (12);
- :mod:`~multigpu.costmodel.zero_stages`: what each rank keeps and sends under the
  ZeRO stages (13);
- :mod:`~multigpu.costmodel.hardware`: links and machines as plain data, with the
  sources of their bandwidths and latencies (12);
- :mod:`~multigpu.costmodel.step`: the step time of DDP and DataParallel, speed-up
  and scaling curves (12);
- :mod:`~multigpu.costmodel.published`: published times and the model's
  predictions for them (12).

New formulas belong in this package.
"""

from multigpu.costmodel.communication import (
    algorithm_bandwidth,
    all_gather_bytes_per_rank,
    alpha_beta_time,
    bus_bandwidth,
    naive_bytes_per_rank,
    reduce_scatter_bytes_per_rank,
    ring_bytes_per_rank,
    ring_bytes_theory,
    tree_steps,
)
from multigpu.costmodel.fit import fit_alpha_beta
from multigpu.costmodel.hardware import LINKS, Link, Machine
from multigpu.costmodel.published import (
    PUBLISHED,
    Published,
    predict,
    published_table,
)
from multigpu.costmodel.step import (
    StepTime,
    Workload,
    bucket_exposed_time,
    calibrate_compute,
    dataparallel_step,
    ddp_step,
    scaling_curve,
    speedup,
)
from multigpu.costmodel.zero_stages import (
    LEDGER_CATEGORIES,
    ZERO_PRECISIONS,
    ZERO_STAGES,
    zero_bytes_per_parameter,
    zero_bytes_sent_per_rank,
    zero_bytes_sent_theory,
    zero_memory_ledger,
)

__all__ = [
    "LEDGER_CATEGORIES",
    "LINKS",
    "PUBLISHED",
    "ZERO_PRECISIONS",
    "ZERO_STAGES",
    "Link",
    "Machine",
    "Published",
    "StepTime",
    "Workload",
    "algorithm_bandwidth",
    "all_gather_bytes_per_rank",
    "alpha_beta_time",
    "bucket_exposed_time",
    "bus_bandwidth",
    "calibrate_compute",
    "dataparallel_step",
    "ddp_step",
    "fit_alpha_beta",
    "naive_bytes_per_rank",
    "predict",
    "published_table",
    "reduce_scatter_bytes_per_rank",
    "ring_bytes_per_rank",
    "ring_bytes_theory",
    "scaling_curve",
    "speedup",
    "tree_steps",
    "zero_bytes_per_parameter",
    "zero_bytes_sent_per_rank",
    "zero_bytes_sent_theory",
    "zero_memory_ledger",
]
