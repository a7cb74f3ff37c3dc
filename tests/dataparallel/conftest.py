"""Fixtures of the tests of multigpu.dataparallel."""

import pytest
from torch.nn.parallel import scatter_gather as torch_scatter_gather


class _CpuChunkScatter:
    """Stands in for PyTorch's CUDA-only ``Scatter`` autograd function: the same
    split (``tensor.chunk(len(devices), dim)``, since chunk_sizes is None), on CPU."""

    @staticmethod
    def apply(target_gpus, chunk_sizes, dim, tensor):
        assert chunk_sizes is None
        return tensor.chunk(len(target_gpus), dim)


@pytest.fixture
def torch_scatter_kwargs(monkeypatch):
    """PyTorch's own scatter_kwargs, runnable on a CPU."""
    monkeypatch.setattr(torch_scatter_gather, "Scatter", _CpuChunkScatter)
    return torch_scatter_gather.scatter_kwargs
