"""A 4-D parallel GPT: data, tensor, pipeline and context parallel on one grid (19).

Taught in ``notebooks/19_four_d_parallel_gpt.ipynb``; composes 08/10 (data
parallel), 15 (tensor parallel), 16 (pipeline, 1F1B) and 17 (context parallel).

- :mod:`~multigpu.gpt4d.config` and :mod:`~multigpu.gpt4d.model`: the tiny GPT
  and its one-process training, the reference;
- :mod:`~multigpu.gpt4d.grid`: rank -> (dp, pp, cp, tp), one group per dimension,
  and the one-line reason a grid cannot work;
- :mod:`~multigpu.gpt4d.comm`: the collectives as autograd functions on a group;
- :mod:`~multigpu.gpt4d.hand`: the 4-D step composed by hand;
- :mod:`~multigpu.gpt4d.torch_api`: the same with FSDP2, ``parallelize_module``
  and ``torch.distributed.pipelining`` on one DeviceMesh;
- :mod:`~multigpu.gpt4d.schedules`: the schedules beyond 1F1B on the same model;
- :mod:`~multigpu.gpt4d.cli` and ``__main__``: the torchrun script
  (``python -m multigpu.gpt4d``).

The names below load on first use, so that the torchrun script can refuse a bad
grid before it imports torch.
"""

from importlib import import_module

_WHERE = {
    "GPTConfig": "config",
    "TinyGPT": "model",
    "count_parameters": "model",
    "make_gpt": "model",
    "make_token_batches": "model",
    "one_process_training": "model",
    "DIMS": "grid",
    "Grid": "grid",
    "build_groups": "grid",
    "grid_problem": "grid",
    "train_4d": "hand",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"multigpu.gpt4d.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'multigpu.gpt4d' has no attribute {name!r}")
