"""nn.DataParallel opened up: scatter, replicate, parallel_apply and gather by hand.

Taught in ``notebooks/02_dataparallel_under_the_hood.ipynb`` and used by the
pitfall notebooks 03-06.

``torch.nn.DataParallel`` runs one process that, on every forward, (1) *scatters*
the batch into chunks, one per device, (2) *replicates* the module onto every
device, (3) runs the replicas in threads (*parallel_apply*) and (4) *gathers* the
outputs onto ``output_device``. Backward runs through the same graph, so every
replica's gradients are summed into the original module's parameters.

PyTorch's versions of these four steps refuse CPU devices, and without CUDA
``nn.DataParallel`` silently calls the module unchanged. This package has the same
functions with the same signatures and semantics, on any list of devices,
including *simulated* ones ("gpu:0", "gpu:1", ... from
``multigpu.core.devices.simulated_devices``) that all compute on the CPU. On real CUDA
devices they run on the GPUs for real. Its files mirror ``torch/nn/parallel``
(https://github.com/pytorch/pytorch/tree/main/torch/nn/parallel), so you can read
them side by side:

============================  ==================================================
this package                  PyTorch
============================  ==================================================
``placement.py``              what CUDA does: ``tensor.device``, ``tensor.to``
``scatter_gather.py``         ``scatter_gather.py`` (scatter, scatter_kwargs,
                              gather)
``replicate.py``              ``replicate.py``
``parallel_apply.py``         ``parallel_apply.py``
``data_parallel.py``          ``data_parallel.py`` (the ``DataParallel`` module)
``recorder.py``               nothing: the memory ledger, measured peaks and
                              timeline of notebooks 03 and 06, attached from
                              outside
============================  ==================================================

``import multigpu.dataparallel as dp`` gives all the public names below.
"""

from multigpu.dataparallel.data_parallel import DataParallel
from multigpu.dataparallel.parallel_apply import parallel_apply
from multigpu.dataparallel.placement import device_of, to_device
from multigpu.dataparallel.recorder import (
    CATEGORIES,
    Event,
    Recorder,
    RecordingDataParallel,
    record_step,
)
from multigpu.dataparallel.replicate import replica_weights, replicate
from multigpu.dataparallel.scatter_gather import (
    gather,
    scatter,
    scatter_kwargs,
    scatter_sizes,
)

__all__ = [
    "CATEGORIES",
    "DataParallel",
    "Event",
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
