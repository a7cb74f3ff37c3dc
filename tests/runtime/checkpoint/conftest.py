"""Fixtures of the tests of multigpu.runtime.checkpoint."""

import pytest
import torch.distributed as dist


@pytest.fixture
def single_process_group():
    """A one-rank gloo process group (in-memory store, no port), torn down after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
