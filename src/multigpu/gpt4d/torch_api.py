"""The 4-D step with PyTorch's APIs on one DeviceMesh (19).

One mesh of shape (dp, pp, cp, tp) (``init_device_mesh``); on it, per rank:

- ``torch.distributed.pipelining``: this rank's stage (:class:`TorchStage`, the
  same cut as :class:`~multigpu.gpt4d.hand.Stage`) in a ``PipelineStage`` over
  the mesh's "pp" group, run by ``Schedule1F1B`` (or another schedule) with
  ``scale_grads=False``, since the loss is already a sum over the global tokens;
- ``parallelize_module`` on the mesh's "tp" dimension: lesson 15's
  :func:`~multigpu.tensor_parallel.dtensor.parallelize_block`;
- FSDP2's ``fully_shard`` on the flattened ("dp", "cp") mesh, as torchtitan does:
  the context-parallel ranks hold the same weights and saw different tokens, so
  they shard and reduce with the data-parallel ones. Its reduce-scatter averages
  by default; ``set_gradient_divide_factor(1.0)`` with
  ``set_force_sum_reduction_for_comms(True)`` make it the sum our loss needs
  (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
  ``_get_gradient_divide_factors``);
- context parallel by hand (:class:`ContextParallelAttention`: keys and values
  all-gathered over "cp"), since PyTorch's ``context_parallel`` needs
  scaled-dot-product attention kernels that do not run on CPU (17).

The tied head on the last stage is a second copy of the embedding; its gradient
and the first stage's are summed over the ``tied`` group, as in the hand-built step.
"""

from __future__ import annotations

import logging
from copy import deepcopy

import torch
import torch.distributed as dist
from torch import nn

from multigpu.gpt4d.comm import gather_sequence
from multigpu.gpt4d.grid import DIMS, Grid, build_groups
from multigpu.gpt4d.hand import causal_attention_from, check_model
from multigpu.gpt4d.model import GPTConfig, TinyGPT, make_gpt, token_loss_sum

__all__ = [
    "TORCH_SCHEDULES",
    "ContextParallelAttention",
    "TorchStage",
    "check_static_shapes",
    "torch_train_4d",
]

TORCH_SCHEDULES = ("1f1b", "gpipe")


class ContextParallelAttention(nn.Module):
    """A Block's attention on seq/cp tokens: the same q, k, v, out (so
    ``parallelize_module``'s plan still finds them), keys and values gathered
    over the context-parallel group (19)."""

    def __init__(self, attn: nn.Module, group: object, start: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = attn.q, attn.k, attn.v, attn.out
        self.heads, self.group, self.start = attn.heads, group, start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            proj(x).view(b, s, self.heads, -1).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )  # heads: this rank's (parallelize_block divides them)
        k, v = gather_sequence(k, self.group), gather_sequence(v, self.group)
        context = causal_attention_from(q, k, v, self.start)
        return self.out(context.transpose(1, 2).reshape(b, s, -1))


class TorchStage(nn.Module):
    """One pipeline stage of a :class:`~multigpu.gpt4d.model.TinyGPT` as plain
    modules: embeddings on the first, ln_f and the tied head on the last (19)."""

    def __init__(
        self,
        model: TinyGPT,
        stage: int,
        num_stages: int,
        cp_group: object,
        cp: int,
        c: int,
    ) -> None:
        super().__init__()
        check_model(model)
        config = model.config
        self.first, self.last = stage == 0, stage == num_stages - 1
        self.local_seq = config.seq_len // cp
        self.start = c * self.local_seq
        per_stage = config.layers // num_stages
        self.layers = list(range(stage * per_stage, (stage + 1) * per_stage))
        self.blocks = nn.ModuleList(deepcopy(model.blocks[i]) for i in self.layers)
        for block in self.blocks:
            block.attn = ContextParallelAttention(block.attn, cp_group, self.start)
        if self.first:
            self.embed, self.pos = deepcopy(model.embed), deepcopy(model.pos)
        if self.last:
            self.ln_f = deepcopy(model.ln_f)
            if not self.first:
                self.head_weight = nn.Parameter(model.embed.weight.detach().clone())

    def tied_weight(self) -> nn.Parameter:
        """The tied embedding as this stage holds it."""
        return self.embed.weight if self.first else self.head_weight

    def source(self, name: str) -> str:
        """This stage's parameter ``name`` -> its name in the one-process model."""
        if name == "head_weight":
            return "embed.weight"
        if name.startswith("blocks."):
            _, j, rest = name.split(".", 2)
            return f"blocks.{self.layers[int(j)]}.{rest}"
        return name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            positions = torch.arange(
                self.start, self.start + x.shape[1], device=x.device
            )
            x = self.embed(x) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.ln_f(x) @ self.tied_weight().T
        return x


def check_static_shapes(
    batches: list[tuple[torch.Tensor, torch.Tensor]], dp: int, microbatches: int
) -> None:
    """Refuse, by name, data that ``torch.distributed.pipelining`` would cut into
    micro-batches of different shapes: a stage learns one shape at its first step
    and receives every micro-batch of every step into a buffer of that shape (19)."""
    sizes = [len(batch[0]) for batch in batches]  # in step order
    if len(set(sizes)) > 1 or sizes[0] % (dp * microbatches):
        raise ValueError(
            f"torch.distributed.pipelining gives every micro-batch the shape of the "
            f"first one, and these batches of {sizes} sequences make uneven "
            f"micro-batches with dp {dp} and {microbatches} micro-batches per "
            f"replica; use batches of one size, a multiple of {dp * microbatches}, "
            "or the hand-built pipeline, which takes any sizes."
        )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def torch_train_4d(
    rank: int,
    grid: Grid,
    config: GPTConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    dtype: torch.dtype = torch.float64,
    lr: float = 0.1,
    microbatches: int = 2,
    schedule: str = "1f1b",
    seed: int = 0,
) -> tuple[dict[str, torch.Tensor], list[float | None]]:
    """SGD with FSDP2 x parallelize_module x pipelining (and CP by hand) on one
    DeviceMesh; returns this stage's full parameters under their one-process names
    and the loss per step on the last stage (None elsewhere) (19)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from multigpu.tensor_parallel.dtensor import parallelize_block

    mesh = init_device_mesh("cpu", grid.shape, mesh_dim_names=DIMS)
    groups = build_groups(grid, rank)  # the tied group (and the same coordinates)
    coords = groups.coords
    cp_group = mesh["cp"].get_group() if grid.cp > 1 else None
    stage = TorchStage(
        make_gpt(config, dtype, seed),
        coords["pp"],
        grid.pp,
        cp_group,
        grid.cp,
        coords["cp"],
    )
    for block in stage.blocks:
        if grid.tp > 1:
            parallelize_block(block, mesh["tp"])
    if grid.dp * grid.cp > 1:
        dp_cp = mesh["dp", "cp"]._flatten("dp_cp")
        for module in [*stage.blocks, stage]:
            fully_shard(module, mesh=dp_cp)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr)
    tokens = {"global": 1}

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, targets) / tokens["global"]

    pipe = None
    if grid.pp > 1:
        pipe_stage = PipelineStage(
            stage,
            coords["pp"],
            grid.pp,
            torch.device("cpu"),
            group=mesh["pp"].get_group(),
        )
        kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule]
        pipe = kind(pipe_stage, microbatches, loss_fn=loss_fn, scale_grads=False)
    if grid.pp > 1:
        check_static_shapes(batches, grid.dp, microbatches)
    losses: list[float | None] = []
    d, c = coords["dp"], coords["cp"]
    for inputs, targets in batches:
        tokens["global"] = targets.numel()
        local = slice(c * stage.local_seq, (c + 1) * stage.local_seq)
        x, y = (t.tensor_split(grid.dp)[d][:, local] for t in (inputs, targets))
        optimizer.zero_grad()
        step_losses: list[torch.Tensor] = []
        if pipe is None:
            for xb, yb in zip(
                x.tensor_split(microbatches), y.tensor_split(microbatches)
            ):
                loss = loss_fn(stage(xb), yb)
                loss.backward()
                step_losses.append(loss.detach())
        elif stage.first:
            pipe.step(x)
        elif stage.last:
            pipe.step(target=y, losses=step_losses)
        else:
            pipe.step()
        if grid.pp > 1 and (stage.first or stage.last):
            grad = _local(stage.tied_weight().grad)
            dist.all_reduce(grad, group=groups.group["tied"])
        optimizer.step()
        if stage.last:
            total = torch.stack(step_losses).sum().reshape(1).to(torch.float64)
            if grid.dp * grid.cp > 1:
                dist.all_reduce(total, group=dp_cp.get_group())
            losses.append(total.item())
        else:
            losses.append(None)
    # Gathering a (dp x cp, tp) parameter whole takes two all-gathers, and DTensor
    # logs a warning about their speed on every rank; this gather is for checking.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    full = {}
    for name, p in stage.named_parameters():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[stage.source(name)] = value.detach().clone()
    return full, losses
