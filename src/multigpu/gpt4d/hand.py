"""The 4-D step composed by hand from the course's pieces (19).

One rank holds a :class:`Stage`: the blocks of its pipeline stage (pp, 16), each
cut by heads and MLP columns over its tensor-parallel group (tp, 15: q, k, v and
fc1 column-parallel, out and fc2 row-parallel), run on its slice of the sequence
(cp, 17: keys and values gathered over the context-parallel group, the causal
mask shifted to the slice's first position), on its share of the batch (dp, 08).
The first stage holds the embeddings, the last the final LayerNorm and the tied
head: with pp > 1 those are two copies of one weight, so their gradients are
summed over the ``tied`` group (Megatron-LM's embedding group). Then every
gradient is summed over dp and over cp, and SGD steps. :func:`train_4d` runs the
steps with lesson 16's 1F1B actions; :func:`reference_shards` cuts a one-process
state the way a rank holds it, to compare.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from multigpu.gpt4d.comm import all_reduce_grads, copy_to, gather_sequence, reduce_from
from multigpu.gpt4d.grid import RankGroups
from multigpu.gpt4d.model import GPTConfig, TinyGPT, make_gpt, token_loss_sum
from multigpu.pipeline.schedules import as_messages, schedule_actions
from multigpu.tensor_parallel.layers import column_shard, row_shard

__all__ = [
    "ParallelBlock",
    "Stage",
    "causal_attention_from",
    "check_model",
    "reference_shards",
    "shard",
    "train_4d",
]


def shard(tensor: torch.Tensor, how: str, rank: int, size: int) -> torch.Tensor:
    """A rank's piece of a one-process tensor: "full" (a copy), "column" (a
    column-parallel layer's rows, 15) or "row" (a row-parallel weight's columns)
    (19)."""
    if how == "column":
        return column_shard(tensor, rank, size)
    if how == "row":
        return row_shard(tensor, rank, size)
    return tensor.detach().clone()


def causal_attention_from(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int
) -> torch.Tensor:
    """Causal attention of queries (b, heads, s_q, d) at positions start.. over
    keys and values (b, heads, s, d) at 0.. (19)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
    future = torch.arange(k.shape[-2], device=q.device)[None, :] > q_pos
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v


_BLOCK = {  # local name -> (name in tensor_parallel.model.Block, how it is cut)
    "ln1_weight": ("ln1.weight", "full"),
    "ln1_bias": ("ln1.bias", "full"),
    "q_weight": ("attn.q.weight", "column"),
    "q_bias": ("attn.q.bias", "column"),
    "k_weight": ("attn.k.weight", "column"),
    "k_bias": ("attn.k.bias", "column"),
    "v_weight": ("attn.v.weight", "column"),
    "v_bias": ("attn.v.bias", "column"),
    "out_weight": ("attn.out.weight", "row"),
    "out_bias": ("attn.out.bias", "full"),
    "ln2_weight": ("ln2.weight", "full"),
    "ln2_bias": ("ln2.bias", "full"),
    "fc1_weight": ("mlp.fc1.weight", "column"),
    "fc1_bias": ("mlp.fc1.bias", "column"),
    "fc2_weight": ("mlp.fc2.weight", "row"),
    "fc2_bias": ("mlp.fc2.bias", "full"),
}


def check_model(model: nn.Module) -> None:
    """Refuse, by name, what the 4-D step cannot cut: a model that is not a
    :class:`~multigpu.gpt4d.model.TinyGPT`, or one with a frozen parameter (its
    copies on several ranks would still be summed and stepped) (19)."""
    if not isinstance(model, TinyGPT):
        raise TypeError(
            f"The 4-D step cuts a TinyGPT (embeddings, blocks, ln_f, tied head); got "
            f"{type(model).__name__}. Build the model with make_gpt(config)."
        )
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ValueError(
            f"The model has a frozen parameter, {frozen[0]}; the 4-D step trains "
            "every parameter. Unfreeze it (requires_grad_(True)) before cutting."
        )


class ParallelBlock(nn.Module):
    """This rank's part of one block: heads/tp heads, ffn/tp MLP columns, on
    seq/cp tokens (19)."""

    def __init__(self, state: dict[str, torch.Tensor], groups: RankGroups) -> None:
        super().__init__()
        t, tp = groups.coords["tp"], groups.size("tp")
        for name, (source, how) in _BLOCK.items():
            self.register_parameter(
                name, nn.Parameter(shard(state[source], how, t, tp))
            )
        self.groups = groups

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        tp, cp = self.groups.group["tp"], self.groups.group["cp"]
        h = copy_to(F.layer_norm(x, x.shape[-1:], self.ln1_weight, self.ln1_bias), tp)
        b, s, _ = h.shape
        q, k, v = (
            F.linear(h, getattr(self, f"{n}_weight"), getattr(self, f"{n}_bias"))
            .view(b, s, -1, x.shape[-1] // self.heads_total)
            .transpose(1, 2)
            for n in "qkv"
        )  # (b, heads/tp, s/cp, head_dim)
        k, v = gather_sequence(k, cp), gather_sequence(v, cp)  # all s keys
        context = (
            causal_attention_from(q, k, v, start).transpose(1, 2).reshape(b, s, -1)
        )
        x = x + reduce_from(F.linear(context, self.out_weight), tp) + self.out_bias
        h = copy_to(F.layer_norm(x, x.shape[-1:], self.ln2_weight, self.ln2_bias), tp)
        partial = F.linear(
            F.gelu(F.linear(h, self.fc1_weight, self.fc1_bias)), self.fc2_weight
        )
        return x + reduce_from(partial, tp) + self.fc2_bias


class Stage(nn.Module):
    """One rank's share of a :class:`~multigpu.gpt4d.model.TinyGPT` (19):
    ``sources`` maps each parameter to (one-process name, how it is cut)."""

    def __init__(self, model: TinyGPT, groups: RankGroups) -> None:
        super().__init__()
        check_model(model)
        config, state = model.config, model.state_dict()
        p, pp = groups.coords["pp"], groups.size("pp")
        self.first, self.last = p == 0, p == pp - 1
        self.groups, self.config = groups, config
        self.local_seq = config.seq_len // groups.size("cp")
        self.sources: dict[str, tuple[str, str]] = {}
        per_stage = config.layers // pp
        layers = range(p * per_stage, (p + 1) * per_stage)
        self.blocks = nn.ModuleList()
        for j, layer in enumerate(layers):
            prefix = f"blocks.{layer}."
            block_state = {
                k.removeprefix(prefix): v
                for k, v in state.items()
                if k.startswith(prefix)
            }
            block = ParallelBlock(block_state, groups)
            block.heads_total = config.heads
            self.blocks.append(block)
            for name, (source, how) in _BLOCK.items():
                self.sources[f"blocks.{j}.{name}"] = (prefix + source, how)
        if self.first:
            self.embed_weight = nn.Parameter(state["embed.weight"].clone())
            self.pos_weight = nn.Parameter(state["pos.weight"].clone())
            self.sources |= {
                "embed_weight": ("embed.weight", "full"),
                "pos_weight": ("pos.weight", "full"),
            }
        if self.last:
            self.ln_f_weight = nn.Parameter(state["ln_f.weight"].clone())
            self.ln_f_bias = nn.Parameter(state["ln_f.bias"].clone())
            self.sources |= {
                "ln_f_weight": ("ln_f.weight", "full"),
                "ln_f_bias": ("ln_f.bias", "full"),
            }
            if not self.first:  # the tied head: a second copy on the last stage
                self.head_weight = nn.Parameter(state["embed.weight"].clone())
                self.sources["head_weight"] = ("embed.weight", "full")

    def tied_weight(self) -> nn.Parameter:
        """The tied embedding as this stage holds it (first or last stage)."""
        return self.embed_weight if self.first else self.head_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = self.groups.coords["cp"] * self.local_seq
        if self.first:
            x = self.embed_weight[x] + self.pos_weight[start : start + x.shape[1]]
        for block in self.blocks:
            x = block(x, start)
        if self.last:
            x = F.layer_norm(x, x.shape[-1:], self.ln_f_weight, self.ln_f_bias)
            x = x @ self.tied_weight().T
        return x


def reference_shards(
    state: dict[str, torch.Tensor], stage: Stage
) -> dict[str, torch.Tensor]:
    """A one-process state cut the way ``stage``'s rank holds it (19)."""
    t, tp = stage.groups.coords["tp"], stage.groups.size("tp")
    return {
        name: shard(state[src], how, t, tp)
        for name, (src, how) in stage.sources.items()
    }


def _run_pipeline(stage: Stage, microbatches, global_tokens: int) -> float:
    """Lesson 16's 1F1B actions on this rank's pipeline; returns its loss sum."""
    groups, pp = stage.groups, stage.groups.size("pp")
    p = groups.coords["pp"]
    actions = schedule_actions("1f1b", pp, len(microbatches))[p]
    inputs, outputs, grads_in, loss = {}, {}, {}, 0.0
    like = stage.blocks[0].q_weight  # dtype and device of the messages
    for action in actions:
        op, i = as_messages(action)[0]
        if op == "forward":
            tokens, targets = microbatches[i]
            out = stage(tokens if stage.first else inputs[i])
            if stage.last:
                out = token_loss_sum(out, targets) / global_tokens
                loss += out.item()
            outputs[i] = out
            continue
        if op == "backward":
            outputs.pop(i).backward(None if stage.last else grads_in.pop(i))
            continue
        operations = []
        for op, i in as_messages(action):
            shape = (len(microbatches[i][0]), stage.local_seq, stage.config.dim)
            if op == "send_activation":
                tensor, peer = outputs[i].detach(), p + 1
            elif op == "send_gradient":
                tensor, peer = inputs.pop(i).grad, p - 1
            elif op == "recv_activation":
                tensor = inputs[i] = torch.empty(
                    shape, dtype=like.dtype, device=like.device
                ).requires_grad_()
                peer = p - 1
            else:
                tensor = grads_in[i] = torch.empty(
                    shape, dtype=like.dtype, device=like.device
                )
                peer = p + 1
            send = dist.isend if op.startswith("send") else dist.irecv
            rank = groups.members["pp"][peer]
            operations.append(dist.P2POp(send, tensor, rank, group=groups.group["pp"]))
        for work in dist.batch_isend_irecv(operations):
            work.wait()
    return loss


def train_4d(
    config: GPTConfig,
    groups: RankGroups,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    dtype: torch.dtype = torch.float64,
    lr: float = 0.1,
    microbatches: int = 2,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[Stage, list[float | None]]:
    """SGD on this rank's part of the grid, one step per batch; returns the stage
    and the global mean loss per step (None off the last stage) (19)."""
    stage = Stage(make_gpt(config, dtype, seed), groups).to(device)
    d, dp = groups.coords["dp"], groups.size("dp")
    c = groups.coords["cp"]
    losses: list[float | None] = []
    for inputs, targets in batches:
        local = slice(c * stage.local_seq, (c + 1) * stage.local_seq)
        mine = [t.tensor_split(dp)[d][:, local].to(device) for t in (inputs, targets)]
        parts = list(zip(*(t.tensor_split(microbatches) for t in mine)))
        for p in stage.parameters():
            p.grad = None
        loss = _run_pipeline(stage, parts, targets.numel())
        if stage.first or stage.last:
            all_reduce_grads([stage.tied_weight()], groups.group["tied"])
        parameters = list(stage.parameters())
        all_reduce_grads(parameters, groups.group["dp"])
        all_reduce_grads(parameters, groups.group["cp"])
        with torch.no_grad():
            for p in parameters:
                p -= lr * p.grad
        if stage.last:
            total = torch.tensor([loss], dtype=torch.float64, device=device)
            for dim in ("dp", "cp"):
                if groups.group[dim] is not None:
                    dist.all_reduce(total, group=groups.group[dim])
            losses.append(total.item())
        else:
            losses.append(None)
    return stage, losses
