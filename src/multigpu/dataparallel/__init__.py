"""nn.DataParallel opened up: scatter, replicate, parallel_apply and gather by hand.

Taught in ``notebooks/02_dataparallel_under_the_hood.ipynb``, used by 03-06.
``torch.nn.DataParallel`` runs one process that, on every forward, (1) *scatters*
the batch into chunks, one per device, (2) *replicates* the module onto every
device, (3) runs the replicas in threads (*parallel_apply*) and (4) *gathers* the
outputs onto ``output_device``. Backward runs through the same graph, so every
replica's gradients are summed into the original module's parameters.

PyTorch's versions of these steps refuse CPU devices, and without CUDA
``nn.DataParallel`` silently calls the module unchanged. This package has the same
functions with the same signatures and semantics, on any list of devices,
including *simulated* ones ("gpu:0", "gpu:1", ... from
``multigpu.core.devices.simulated_devices``) that all compute on the CPU; on real
CUDA devices they run on the GPUs. Its files mirror ``torch/nn/parallel``
(https://github.com/pytorch/pytorch/tree/main/torch/nn/parallel), side by side:
``placement.py`` (what CUDA does: ``tensor.device``, ``tensor.to``),
``scatter_gather.py`` (scatter, scatter_kwargs, gather), ``replicate.py``,
``parallel_apply.py``, ``data_parallel.py`` (the ``DataParallel`` module).

Not in PyTorch, attached from outside: the recorder of notebooks 03 and 06
(``recording.py``, ``recorded_step.py``, ``ledger.py``; its private helpers
``_peak_memory.py``, ``_activations.py``): the memory ledger, the measured peaks
and the timeline. ``import multigpu.dataparallel as dp`` gives all the public
names below.
"""

from multigpu.dataparallel.data_parallel import DataParallel
from multigpu.dataparallel.ledger import MEMORY_CATEGORIES
from multigpu.dataparallel.parallel_apply import parallel_apply
from multigpu.dataparallel.placement import device_of, to_device
from multigpu.dataparallel.recorded_step import record_step
from multigpu.dataparallel.recording import (
    DeviceEvent,
    Recorder,
    RecordingDataParallel,
)
from multigpu.dataparallel.replicate import replica_weights, replicate
from multigpu.dataparallel.scatter_gather import (
    gather,
    scatter,
    scatter_kwargs,
    scatter_sizes,
)

__all__ = [
    "DataParallel",
    "DeviceEvent",
    "MEMORY_CATEGORIES",
    "Recorder",
    "RecordingDataParallel",
    "device_of",
    "gather",
    "parallel_apply",
    "record_step",
    "replica_weights",
    "replicate",
    "scatter",
    "scatter_kwargs",
    "scatter_sizes",
    "to_device",
]
