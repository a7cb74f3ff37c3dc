"""Run one stage's actions on a rank: compute, send and receive, and record (16).

Rank ``s`` of ``p`` holds stage ``s`` of the model. Its input for a forward is the
micro-batch (stage 0) or the activation received from rank ``s - 1``; its output
goes to rank ``s + 1``, and the last stage turns it into the loss. A backward
starts from the gradient received from rank ``s + 1`` (the last stage: from the
loss) and sends the gradient of its input to rank ``s - 1``. Each micro-batch's
loss is its *summed* cross-entropy divided by the whole batch's size, so the
gradients that accumulate over the micro-batches are those of one process on the
whole batch, even when the micro-batches differ in size.

While it runs, the rank records its timeline
(:class:`~multigpu.pipeline.ScheduleBlock`), the micro-batches in flight and the
bytes autograd saves for backward (the activations), and the bytes it sends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.pipeline.schedules import Action, as_messages
from multigpu.pipeline.timeline import ScheduleBlock

__all__ = [
    "MessageTimeoutError",
    "StageResult",
    "activation_shapes",
    "microbatch_loss",
    "one_process_gradients",
    "run_actions",
]


class MessageTimeoutError(RuntimeError):
    """A send or receive whose neighbour never posted the matching message."""


def microbatch_loss(logits: torch.Tensor, y: torch.Tensor, num_samples: int):
    """Summed cross-entropy divided by the whole batch's size: the micro-batches'
    losses add up to the mean over the batch."""
    return F.cross_entropy(logits, y, reduction="sum") / num_samples


def one_process_gradients(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor | None]]:
    """One process on the whole batch: (mean loss, {name: gradient or None})."""
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    grads = {
        n: None if p.grad is None else p.grad.clone()
        for n, p in model.named_parameters()
    }
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def activation_shapes(stages: list[nn.Module], X: torch.Tensor) -> list[torch.Size]:
    """The shape of one sample's output of each stage (run on one sample)."""
    shapes, h = [], X[:1]
    with torch.no_grad():
        for stage in stages:
            h = stage(h)
            shapes.append(h.shape[1:])
    return shapes


@dataclass
class StageResult:
    """What rank ``stage`` measured in one pipeline step."""

    stage: int
    gradients: dict[str, torch.Tensor | None] = field(default_factory=dict)
    loss: float = 0.0  # the last stage's summed micro-batch losses
    blocks: list[ScheduleBlock] = field(default_factory=list)
    peak_in_flight: int = 0
    saved_bytes: list[int] = field(default_factory=list)  # per micro-batch
    peak_saved_bytes: int = 0
    bytes_sent: int = 0


class _SavedBytes:
    """Counts the bytes autograd saves for backward, parameters excluded."""

    def __init__(self, module: nn.Module) -> None:
        self.skip = {p.data_ptr() for p in module.parameters()}
        self.skip |= {b.data_ptr() for b in module.buffers()}
        self.seen: set[int] = set()
        self.total = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        pointer = tensor.data_ptr()
        if pointer not in self.skip and pointer not in self.seen:
            self.seen.add(pointer)
            self.total += tensor.numel() * tensor.element_size()
        return tensor


def _wait(works: list, timeout: float | None, stage: int, action: Action) -> None:
    for work in works:
        try:
            work.wait() if timeout is None else work.wait(timedelta(seconds=timeout))
        except RuntimeError as exc:
            if "Timed out" not in str(exc):
                raise
            what = " + ".join(f"{op}({i})" for op, i in as_messages(action))
            gloo = str(exc).split("] ")[-1]  # gloo's words, without its source path
            raise MessageTimeoutError(
                f"stage {stage} waited {timeout:g} s in {what}: its neighbour never "
                f"posted the matching message (a deadlock, or a message missing). "
                f"gloo: {gloo}"
            ) from None


def run_actions(
    module: nn.Module,
    actions: list[Action],
    stage: int,
    num_stages: int,
    microbatches: list[tuple[torch.Tensor, torch.Tensor]],
    shape: torch.Size | None = None,
    in_shape: torch.Size | None = None,
    delays: tuple[float, float] = (0.0, 0.0),
    message_timeout: float | None = None,
) -> StageResult:
    """Run ``actions`` as stage ``stage`` of ``num_stages`` (this rank's number in
    the process group); ``shape``/``in_shape``: one sample's output of this stage
    and of the previous one; ``delays``: seconds added to every forward and
    backward (16)."""
    num_samples = sum(len(x) for x, _ in microbatches)
    dtype = microbatches[0][0].dtype
    result = StageResult(stage, saved_bytes=[0] * len(microbatches))
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    grads_in: dict[int, torch.Tensor] = {}  # gradient received for an output
    live = 0
    for action in actions:
        op, i = as_messages(action)[0]
        if op in ("forward", "backward"):
            start = time.perf_counter()
            if op == "forward":
                counter = _SavedBytes(module)
                with torch.autograd.graph.saved_tensors_hooks(
                    counter.pack, lambda t: t
                ):
                    x = microbatches[i][0] if stage == 0 else inputs[i]
                    out = module(x)
                    if stage == num_stages - 1:
                        out = microbatch_loss(out, microbatches[i][1], num_samples)
                        result.loss += out.item()
                outputs[i] = out
                result.saved_bytes[i] = counter.total
                live += counter.total
                result.peak_in_flight = max(result.peak_in_flight, len(outputs))
                result.peak_saved_bytes = max(result.peak_saved_bytes, live)
            else:
                out = outputs.pop(i)
                grad = None if stage == num_stages - 1 else grads_in.pop(i)
                if out.requires_grad:  # False: nothing before or in it is trained
                    out.backward(grad)
                live -= result.saved_bytes[i]
            time.sleep(delays[op == "backward"])
            result.blocks.append(
                ScheduleBlock(stage, op, i, start, time.perf_counter())
            )
            continue
        operations = []
        for op, i in as_messages(action):
            size = (len(microbatches[i][0]),)
            if op == "send_activation":
                tensor, peer = outputs[i].detach(), stage + 1
            elif op == "send_gradient":
                tensor, peer = inputs.pop(i).grad, stage - 1
            elif op == "recv_activation":
                tensor = torch.empty(size + tuple(in_shape), dtype=dtype)
                inputs[i], peer = tensor.requires_grad_(), stage - 1
            else:
                tensor = torch.empty(size + tuple(shape), dtype=dtype)
                grads_in[i], peer = tensor, stage + 1
            send = op.startswith("send")
            result.bytes_sent += tensor.numel() * tensor.element_size() * send
            operations.append(
                dist.P2POp(dist.isend if send else dist.irecv, tensor, peer)
            )
        _wait(dist.batch_isend_irecv(operations), message_timeout, stage, action)
    for key in list(outputs):  # never backward: drop them
        del outputs[key]
    return result
