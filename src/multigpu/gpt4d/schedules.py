"""Pipeline schedules beyond 1F1B on the tiny GPT, with PyTorch's pipelining (19).

With ``v`` stages per rank the model is cut into ``v * pp`` stages:
``ScheduleInterleaved1F1B`` and ``ScheduleInterleavedZeroBubble`` place them in a
loop (rank r holds stages r, r + pp, ...), ``ScheduleZBVZeroBubble`` and
``ScheduleDualPipeV`` in a V (rank r holds stages r and 2 pp - 1 - r, so rank 0
holds the first and the last: the tied embedding and head on one rank). The
zero-bubble schedules split a backward into the input's gradient (I), which the
previous stage waits for, and the weights' (W), which can wait to fill a bubble.

``scale_grads``: by default a schedule divides the summed gradients by the number
of micro-batches (``scale_grads`` in torch/distributed/pipelining/schedules.py),
right for a loss that is a mean per micro-batch; our loss is already divided by
the whole batch's token count, so ``scale_grads=False`` gives one process's
gradients.

:func:`plan_of` reads the plan a schedule executes (its ``pipeline_order``);
:func:`simulate_plan` plays it with unit times and measures its bubble;
:func:`summarize_runs` does both for every case of a launch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from multigpu.gpt4d.config import GPTConfig
from multigpu.gpt4d.model import make_gpt, token_loss_sum
from multigpu.gpt4d.torch_api import TorchStage
from multigpu.pipeline.schedules import as_messages, schedule_actions

__all__ = [
    "COMPUTE_ACTIONS",
    "COSTS",
    "PIPELINE_SCHEDULES",
    "course_plan",
    "plan_of",
    "schedule_training",
    "simulate_plan",
    "stage_indices",
    "summarize_runs",
]

# name -> (class name in torch.distributed.pipelining, stages per rank, placement)
PIPELINE_SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
    "interleaved-zero-bubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "dualpipev": ("ScheduleDualPipeV", 2, "v"),
}
COMPUTE_ACTIONS = ("F", "B", "I", "W", "OVERLAP_F_B")


def stage_indices(schedule: str, rank: int, pp: int) -> list[int]:
    """The stages rank ``rank`` of ``pp`` holds under ``schedule`` (19)."""
    _, per_rank, placement = PIPELINE_SCHEDULES[schedule]
    if per_rank == 1:
        return [rank]
    if placement == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(per_rank)]


def plan_of(pipeline_order: dict[int, list]) -> dict[int, list[tuple[int, str, int]]]:
    """A schedule's ``pipeline_order`` as (stage, kind, micro-batch) computations
    per rank, in order; an overlapped F+B counts as its F then its B (19)."""
    plan = {}
    for rank, actions in pipeline_order.items():
        plan[rank] = []
        for action in actions:
            for a in getattr(action, "sub_actions", None) or [action]:
                kind = None if a is None else str(a.computation_type.value)
                if kind in COMPUTE_ACTIONS:
                    plan[rank].append((a.stage_index, kind, a.microbatch_index))
    return plan


def course_plan(schedule: str, pp: int, microbatches: int) -> dict[int, list]:
    """GPipe's or 1F1B's computations per rank from lesson 16's action lists (19)."""
    kinds = {"forward": "F", "backward": "B"}
    every = schedule_actions(schedule, pp, microbatches)
    return {
        rank: [
            (rank, kinds[op], i)
            for action in actions
            for op, i in as_messages(action)
            if op in kinds
        ]
        for rank, actions in enumerate(every)
    }


COSTS = {"F": 1, "I": 1, "W": 1, "B": 2}  # a backward is its I and its W


def simulate_plan(
    plan: dict[int, list[tuple[int, str, int]]], num_stages: int
) -> tuple[list[tuple[int, int, str, int, int, int]], float]:
    """Play a plan with unit times (F = I = W = 1, B = 2): each rank runs its
    computations in order, each as soon as what it needs is done. Returns the
    blocks (rank, stage, kind, micro-batch, start, end) and the bubble, idle time
    over all time (19)."""
    done: dict[tuple[int, str, int], int] = {}  # (stage, kind, mb) -> end time

    def ready(stage: int, kind: str, mb: int) -> int | None:
        needs = []
        if kind == "F" and stage > 0:
            needs.append([(stage - 1, "F", mb)])
        if kind in ("B", "I"):
            needs.append([(stage, "F", mb)])
            if stage < num_stages - 1:
                needs.append([(stage + 1, "B", mb), (stage + 1, "I", mb)])
        if kind == "W":
            needs.append([(stage, "I", mb)])
        times = []
        for options in needs:
            found = [done[o] for o in options if o in done]
            if not found:
                return None
            times.append(min(found))
        return max(times, default=0)

    clock = dict.fromkeys(plan, 0)
    position = dict.fromkeys(plan, 0)
    blocks = []
    while any(position[r] < len(plan[r]) for r in plan):
        moved = False
        for rank in plan:
            while position[rank] < len(plan[rank]):
                stage, kind, mb = plan[rank][position[rank]]
                after = ready(stage, kind, mb)
                if after is None:
                    break
                start = max(clock[rank], after)
                clock[rank] = done[(stage, kind, mb)] = start + COSTS[kind]
                blocks.append((rank, stage, kind, mb, start, clock[rank]))
                position[rank] += 1
                moved = True
        if not moved:
            raise RuntimeError("The plan deadlocks: no rank can run its next action.")
    makespan = max(clock.values())
    work = sum(end - start for *_, start, end in blocks)
    return blocks, 1 - work / (makespan * len(plan))


def summarize_runs(results: list[list[dict]], pp: int = 2) -> list[dict]:
    """Per case of a schedules launch (``results``: per rank, per case, as
    :func:`multigpu.ranks.gpt4d.run_schedules` returns), its schedule,
    ``scale_grads``, largest difference from one process over the ranks, the
    blocks and bubble of its plan played with unit times (19)."""
    rows = []
    for index, case in enumerate(results[0]):
        name = case["schedule"]
        stages = pp * PIPELINE_SCHEDULES[name][1]
        blocks, bubble = simulate_plan(case["plan"], stages)
        rows.append(
            {
                "schedule": name,
                "scale_grads": case["scale_grads"],
                "max_diff": max(rank[index]["max_diff"] for rank in results),
                "blocks": blocks,
                "microbatches": case["microbatches"],
                "bubble": bubble,
            }
        )
    return rows


def schedule_training(
    rank: int,
    pp: int,
    config: GPTConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    schedule: str,
    microbatches: int,
    scale_grads: bool = False,
    dtype: torch.dtype = torch.float64,
    lr: float = 0.1,
) -> tuple[dict[str, torch.Tensor], list[float | None], dict[int, list]]:
    """SGD with ``schedule`` on ``pp`` ranks (the whole world); this rank's
    parameters under one-process names, the loss per step (None off the last
    stage) and the plan, action names per rank (19)."""
    from torch.distributed import pipelining

    class_name, per_rank, _ = PIPELINE_SCHEDULES[schedule]
    num_stages = per_rank * pp
    model = make_gpt(config, dtype)
    indices = stage_indices(schedule, rank, pp)
    modules = [TorchStage(model, i, num_stages, None, 1, 0) for i in indices]
    stages = [
        pipelining.PipelineStage(m, i, num_stages, torch.device("cpu"))
        for m, i in zip(modules, indices)
    ]
    tokens = {"global": 1}

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, targets) / tokens["global"]

    kind = getattr(pipelining, class_name)
    runner = kind(
        stages[0] if per_rank == 1 else stages,
        microbatches,
        loss_fn=loss_fn,
        scale_grads=scale_grads,
    )
    parameters = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=lr)
    ends = [m for m in modules if m.first or m.last]
    tied_ranks = sorted({stage_indices(schedule, r, pp)[0] for r in range(pp)} & set())
    holders = {
        r
        for r in range(pp)
        for i in stage_indices(schedule, r, pp)
        if i in (0, num_stages - 1)
    }
    tied_group = dist.new_group(sorted(holders)) if len(holders) > 1 else None
    del tied_ranks
    losses: list[float | None] = []
    for inputs, targets in batches:
        tokens["global"] = targets.numel()
        optimizer.zero_grad()
        step_losses: list[torch.Tensor] = []
        has_first = any(m.first for m in modules)
        has_last = any(m.last for m in modules)
        kwargs = {}
        if has_last:
            kwargs = {"target": targets, "losses": step_losses}
        runner.step(*((inputs,) if has_first else ()), **kwargs)
        if ends:
            total = sum(m.tied_weight().grad for m in ends)
            if tied_group is not None:
                dist.all_reduce(total, group=tied_group)
            for m in ends:
                m.tied_weight().grad.copy_(total)
        optimizer.step()
        losses.append(torch.stack(step_losses).sum().item() if has_last else None)
    full = {}
    for m in modules:
        for name, p in m.named_parameters():
            full[m.source(name)] = p.detach().clone()
    if per_rank == 1:  # these run their own loop, not pipeline_order: 16's lists
        return full, losses, course_plan(schedule, pp, microbatches)
    return full, losses, plan_of(runner.pipeline_order)
