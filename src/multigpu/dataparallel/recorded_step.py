"""One training step recorded: forward, loss on ``output_device``, backward (03,
06)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from multigpu.dataparallel._activations import _catch_activations
from multigpu.dataparallel.data_parallel import DataParallel
from multigpu.dataparallel.placement import device_of, place, tensors_in, to_device
from multigpu.dataparallel.recording import Recorder

__all__ = ["record_step"]


def record_step(
    model: DataParallel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    track_memory: bool = True,
) -> tuple[torch.Tensor, Recorder]:
    """One training step (forward, loss on ``output_device``, backward) recorded:
    returns ``(loss, recorder)`` with the ledger, the measured peak per device and
    the timeline (03, 06). The ledger sums every tensor the step creates, as if
    nothing were freed; ``recorder.peak`` is the most each device held at once.
    ``track_memory=False`` skips the peak, which slows every op down: use it when
    you time the step (06)."""
    if loss_fn is None:
        loss_fn = nn.functional.cross_entropy
    recorder = Recorder(track_memory)
    memory = recorder._memory
    output_device = model.output_device
    # a batch already on a device is held there from the start, as on a GPU
    memory.hold_resident(
        [t for t in tensors_in([inputs, targets]) if device_of(t).name != "cpu"]
    )
    with memory.on(None):
        outputs = recorder.watch(model)(inputs)
        with memory.on(output_device):
            targets = to_device(targets, output_device)
            recorder.hold(output_device, "inputs", targets)
            with (
                recorder.span(output_device, "loss"),
                _catch_activations(recorder, output_device, outputs, targets) as kept,
            ):
                loss = place(loss_fn(outputs, targets), output_device)
                kept.append(loss)
            recorder.hold(output_device, "loss", loss)
            memory.tag_backward(loss, output_device)
            del outputs, targets, kept  # backward frees what nothing else holds
            start = recorder.now()
            loss.backward()
    if not recorder._backward_spans:  # one device: no replicas, one backward span
        recorder.add_event(model.src_device, "backward", start, recorder.now())
    grads = [p.grad for p in model.module.parameters() if p.grad is not None]
    recorder.hold(model.src_device, "gradients", grads)
    for grad in grads:  # the summed gradients live with the parameters
        memory.claim(grad, model.src_device)
    del grads
    memory.close()
    return loss, recorder
