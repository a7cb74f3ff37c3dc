"""On a CUDA GPU: activation checkpointing lowers what the allocator holds between
forward and backward by the bytes the saved-tensor hooks count, and those bytes
equal the formula, as they do on the CPU (test_checkpointing.py). The tests need one
GPU and skip without it."""

import pytest
import torch
from torch.nn import functional as F

from multigpu.costmodel.fsdp import checkpointed_activation_bytes
from multigpu.fsdp import SavedActivations, make_block_stack, parameter_storages

# Activations of megabytes, so that the allocator's rounding (512 bytes) is noise.
BLOCKS, WIDTH, BATCH = 9, 512, 256


def forward_on_gpu(every, segment):
    """(bytes the hooks count, bytes the CUDA allocator gained) between the forward
    pass and the backward pass of one step on cuda:0."""
    torch.manual_seed(0)
    stack = make_block_stack(BLOCKS, WIDTH, every, segment).cuda()
    X = torch.randn(BATCH, WIDTH, device="cuda")
    y = torch.randint(0, WIDTH, (BATCH,), device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with SavedActivations(parameter_storages(stack.parameters())) as saved:
        output = stack(X)
    torch.cuda.synchronize()
    counted, gained = saved.alive_bytes, torch.cuda.memory_allocated() - before
    F.cross_entropy(output, y).backward()
    return counted, gained


@pytest.mark.gpu(1)
@pytest.mark.parametrize("every,segment", [(1, 1), (2, 1), (1, 3)])
def test_checkpointing_frees_on_the_gpu_what_the_hooks_count(every, segment):
    plain_counted, plain_gained = forward_on_gpu(0, 1)
    counted, gained = forward_on_gpu(every, segment)
    numbers = BATCH * WIDTH  # one (B, width) float32 tensor: numbers * 4 bytes
    assert counted == checkpointed_activation_bytes(
        BLOCKS, 5 * numbers * 4, numbers * 4, every, segment
    )
    saved_by_checkpointing = plain_counted - counted
    freed_on_the_gpu = plain_gained - gained
    assert saved_by_checkpointing > 0
    assert (
        abs(freed_on_the_gpu - saved_by_checkpointing) <= 0.02 * saved_by_checkpointing
    )
