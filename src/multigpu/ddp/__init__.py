"""DistributedDataParallel with torchrun: a training script and its parts.

Taught in ``notebooks/09_ddp_torchrun.ipynb`` (the script, the sampler, evaluation)
and ``notebooks/09b_ddp_in_practice.ipynb`` (checkpoints, accumulation, SyncBatchNorm,
uneven data, ports, AMP); notebook 11's script, ``python -m multigpu.snapshot``, is
built on this one's. Rank 0 prints one line per epoch (``--help``: options)::

    torchrun --standalone --nproc-per-node=2 -m multigpu.ddp --epochs 2

Started with plain ``python`` it stops with an error that says to use torchrun.
Notebook 08's recipe with the library doing the work, one file per part:

- ``wrapper``: :func:`wrap`, DDP broadcasts rank 0's weights, averages gradients;
- ``loader``: a seeded ``DistributedSampler`` that drops, not pads, the tail of
  an epoch, so DDP steps like one process (:func:`distributed_loader`);
- ``evaluation``: every sample exactly once (:func:`evaluate_distributed`), unlike
  the padded sampler's biased sum (:func:`evaluate_padded`);
- ``accumulation``: :func:`scaled_lr`, :func:`accumulate` (``no_sync``, AMP);
- ``checkpoints``: :func:`save_on_main`, :func:`resume`;
- ``loop``: :func:`train_ddp_loop`, what every rank runs (Ctrl-C: :class:`Interrupted`);
- ``__main__``: the torchrun script; ``cli``, ``script_checks``, ``configure``: its
  options and their checks, ``script``: what it does around its loop, ending with
  ``agreement`` (:func:`check_same_weights`), all shared with notebook 11's script;
  ``ports``: a port in use (09b).

The rank environment (:func:`setup`, :func:`read_rank_env`) comes from
:mod:`multigpu.runtime.rank`, the launchers from :mod:`multigpu.runtime.launch`;
what the notebooks' ranks run is in :mod:`multigpu.ranks.ddp`. PyTorch's files:
https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py
and https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py.
"""

from multigpu.ddp.accumulation import ACCUMULATIONS, LR_SCALINGS, accumulate, scaled_lr
from multigpu.ddp.agreement import (
    WeightsDifferError,
    check_same_weights,
    tensor_digests,
    weights_disagreement,
)
from multigpu.ddp.checkpoints import (
    changed_setting,
    optimizer_settings,
    resume,
    save_on_main,
)
from multigpu.ddp.cli import build_model, parse_args
from multigpu.ddp.evaluation import evaluate_distributed, evaluate_padded
from multigpu.ddp.loader import distributed_loader, exact_shard, sampler_shards
from multigpu.ddp.loop import Interrupted, train_ddp_loop
from multigpu.ddp.ports import eaddrinuse_lines, torchrun_on_port
from multigpu.ddp.wrapper import wrap
from multigpu.runtime.launch import (  # the launchers, as taught in 09
    DEFAULT_DEADLINE_S,
    TorchrunError,
    exit_rank,
    in_one_launch,
    run_torchrun,
    spawn,
)
from multigpu.runtime.rank import (  # the rank environment, taught in 09
    COMMAND,
    ENV_NAMES,
    TABLE_NAMES,
    NotEnoughGPUsError,
    NotLaunchedByTorchrunError,
    RankEnv,
    is_main_process,
    rank_device,
    rank_table,
    read_rank_env,
    reduce_value,
    setup,
)

__all__ = [
    "ACCUMULATIONS",
    "COMMAND",
    "DEFAULT_DEADLINE_S",
    "Interrupted",
    "ENV_NAMES",
    "LR_SCALINGS",
    "TABLE_NAMES",
    "NotEnoughGPUsError",
    "NotLaunchedByTorchrunError",
    "RankEnv",
    "TorchrunError",
    "WeightsDifferError",
    "accumulate",
    "build_model",
    "changed_setting",
    "check_same_weights",
    "distributed_loader",
    "eaddrinuse_lines",
    "evaluate_distributed",
    "evaluate_padded",
    "exact_shard",
    "exit_rank",
    "in_one_launch",
    "is_main_process",
    "optimizer_settings",
    "parse_args",
    "rank_device",
    "rank_table",
    "read_rank_env",
    "reduce_value",
    "resume",
    "run_torchrun",
    "sampler_shards",
    "save_on_main",
    "scaled_lr",
    "setup",
    "tensor_digests",
    "spawn",
    "torchrun_on_port",
    "train_ddp_loop",
    "weights_disagreement",
    "wrap",
]
