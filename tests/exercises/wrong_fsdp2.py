"""What learners write for notebook 14b's exercises, right and wrong: one step of
gradient accumulation with FSDP2 (exercise 1) and a model built on the meta device
and sharded (exercise 2), importable by the ranks that the checkers of
:mod:`multigpu.exercises.fsdp2` start."""

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F


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
