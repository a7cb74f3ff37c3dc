"""What learners write for notebook 14b's exercises, right and wrong: one step of
gradient accumulation with FSDP2 (exercise 1), a model built on the meta device
and sharded (exercise 2) and a wrap that fits a memory budget (exercise 3),
importable by the ranks that the checkers of :mod:`multigpu.exercises.fsdp2`
start."""

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn import functional as F

from multigpu.fsdp import ResidualBlock


def reference_step(model, optimizer, micro_batches):
    """Right: sync only on the last micro-batch, loss divided, one step."""
    for index, (inputs, labels) in enumerate(micro_batches):
        model.set_requires_gradient_sync(index == len(micro_batches) - 1)
        loss = F.cross_entropy(model(inputs), labels) / len(micro_batches)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def never_synced_step(model, optimizer, micro_batches):
    """Turned sync off and never back on: no gradient is ever reduced."""
    model.set_requires_gradient_sync(False)
    for inputs, labels in micro_batches:
        loss = F.cross_entropy(model(inputs), labels) / len(micro_batches)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def always_synced_step(model, optimizer, micro_batches):
    """Never turned sync off: right weights, a reduce-scatter per micro-batch."""
    for inputs, labels in micro_batches:
        loss = F.cross_entropy(model(inputs), labels) / len(micro_batches)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def undivided_step(model, optimizer, micro_batches):
    """Forgot to divide each micro-batch's loss by the number of micro-batches."""
    for index, (inputs, labels) in enumerate(micro_batches):
        model.set_requires_gradient_sync(index == len(micro_batches) - 1)
        F.cross_entropy(model(inputs), labels).backward()
    optimizer.step()
    optimizer.zero_grad()


def stepping_every_micro_batch_step(model, optimizer, micro_batches):
    """Stepped the optimizer after every micro-batch."""
    for index, (inputs, labels) in enumerate(micro_batches):
        model.set_requires_gradient_sync(index == len(micro_batches) - 1)
        loss = F.cross_entropy(model(inputs), labels) / len(micro_batches)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


# Exercise 2: building a sharded model on the meta device.


def _shard(model, mesh):
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def reference_build_sharded(build, mesh):
    """Right: meta, shard, to_empty, reset_parameters."""
    with torch.device("meta"):
        model = build()
    _shard(model, mesh)
    model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def built_on_cpu_build_sharded(build, mesh):
    """Built the whole model on the CPU, then sharded it."""
    model = build()
    _shard(model, mesh)
    return model


def to_empty_first_build_sharded(build, mesh):
    """Allocated (to_empty) before sharding: the whole model on every rank."""
    with torch.device("meta"):
        model = build()
    model.to_empty(device="cpu")
    _shard(model, mesh)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def not_reset_build_sharded(build, mesh):
    """Allocated the shards but never initialised them."""
    with torch.device("meta"):
        model = build()
    _shard(model, mesh)
    model.to_empty(device="cpu")
    return model


# Exercise 3: a wrap whose step fits the memory budget.

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _blocks(model):
    return [m for m in model.modules() if isinstance(m, ResidualBlock)]


def reference_wrap(model, mesh):
    """Right: each block checkpointed and a bf16 unit resharded after forward,
    then the root."""
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh, mp_policy=BF16, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    return model


def checkpoint_wrapper_wrap(model, mesh):
    """Right too: PyTorch's checkpoint_wrapper module around each block, the
    default reshard_after_forward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
    )

    for index, layer in enumerate(model):
        if isinstance(layer, ResidualBlock):
            model[index] = checkpoint_wrapper(layer)
            fully_shard(model[index], mesh=mesh, mp_policy=BF16)
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    return model


def bf16_reductions_wrap(model, mesh):
    """Right too, less precise: gradients reduced in bf16 (within tolerance)."""
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16
    )
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def float32_wrap(model, mesh):
    """No MixedPrecisionPolicy: parameters gathered and computed in float32."""
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def no_checkpoint_wrap(model, mesh):
    """Forgot activation checkpointing: every block saves its inside."""
    for block in _blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=BF16)
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    return model


def kept_after_forward_wrap(model, mesh):
    """reshard_after_forward=False: every block keeps its gathered parameters."""
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh, mp_policy=BF16, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    return model


def no_root_wrap(model, mesh):
    """Forgot fully_shard on the whole model."""
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh, mp_policy=BF16)
    return model


def unsharded_wrap(model, mesh):
    """The exercise's starting point: returns the model as it came."""
    return model


def returns_nothing_wrap(model, mesh):
    """Shards the model in place and forgets to return it."""
    fully_shard(model, mesh=mesh, mp_policy=BF16)


def bf16_master_wrap(model, mesh):
    """Cast the whole model to bf16: the optimizer's master copy too."""
    return reference_wrap(model.to(torch.bfloat16), mesh)


def frozen_first_layer_wrap(model, mesh):
    """Froze the first Linear to save its gradient's memory."""
    model[0].requires_grad_(False)
    return reference_wrap(model, mesh)


def reinitialised_wrap(model, mesh):
    """Copied exercise 2's last loop: re-draws every weight after sharding."""
    model = reference_wrap(model, mesh)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def root_first_wrap(model, mesh):
    """Sharded the root before the blocks."""
    fully_shard(model, mesh=mesh, mp_policy=BF16)
    for block in _blocks(model):
        checkpoint(block)
        fully_shard(block, mesh=mesh, mp_policy=BF16)
    return model


def root_only_build_sharded(build, mesh):
    """Sharded only the whole model, not each layer."""
    with torch.device("meta"):
        model = build()
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def never_allocated_build_sharded(build, mesh):
    """Sharded on the meta device and stopped there: no storage at all."""
    with torch.device("meta"):
        model = build()
    _shard(model, mesh)
    return model
