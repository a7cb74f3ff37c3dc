"""The ranks of notebook 18 and the launchers that start them (18).

:func:`ep_layer_rank` runs cases of the expert-parallel layer (one forward and
backward each, :class:`multigpu.expert_parallel.LayerCase`); :func:`ep_dp_rank`
cases of EP x DP training (:class:`multigpu.expert_parallel.EPDPCase`). A case
names its own ranks, so cases of 1, 2, 3 and 4 ranks run in one launch: the
other ranks create the case's process groups and go on to the next case.
:func:`run_layer_cases` and :func:`run_ep_dp_cases` start them.
:func:`all_to_all_parity_rank` compares the lesson's autograd all-to-all with
PyTorch's; :func:`guessed_sizes_rank` shows what gloo does with split sizes a rank
guessed (:func:`run_guessed_sizes`). :func:`dispatch_exercise_rank` runs the
learner's dispatch and combine for the exercise's checker, every
``all_to_all_single`` checked first so that wrong sizes raise the same
:class:`SplitSizeError` on every rank instead of aborting them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from multigpu.expert_parallel import (
    EPDPCase,
    LayerCase,
    all_to_all,
    ep_dp_on_rank,
    layer_on_rank,
)
from multigpu.runtime.launch import DEFAULT_TIMEOUT_S, QUICK_TIMEOUT_S, spawn

__all__ = [
    "all_to_all_parity_rank",
    "guessed_sizes_rank",
    "run_guessed_sizes",
    "dispatch_exercise_rank",
    "ep_dp_rank",
    "ep_layer_rank",
    "run_all_to_all_parity",
    "run_ep_dp_cases",
    "run_layer_cases",
]


def _world_size_for(cases: Sequence) -> int:
    return max(max(case.ranks) for case in cases) + 1


def ep_layer_rank(
    rank: int, world_size: int, cases: Sequence[LayerCase]
) -> list[dict | None]:
    """Rank function: this rank's result for each case (None where it takes no
    part), groups created once per set of ranks (18)."""
    torch.set_num_threads(1)
    cache: dict = {}
    return [layer_on_rank(case, cache) for case in cases]


def run_layer_cases(
    cases: Sequence[LayerCase], timeout: float = DEFAULT_TIMEOUT_S
) -> list[list[dict]]:
    """Start as many ranks as the cases need, once, and run every case; per case,
    the results of its ranks in their order (18)."""
    per_rank = spawn(
        ep_layer_rank, _world_size_for(cases), list(cases), timeout=timeout
    )
    return [[per_rank[rank][k] for rank in case.ranks] for k, case in enumerate(cases)]


def ep_dp_rank(
    rank: int, world_size: int, cases: Sequence[EPDPCase]
) -> list[dict | None]:
    """Rank function: EP x DP training for each case this rank is part of (18)."""
    torch.set_num_threads(1)
    cache: dict = {}
    return [ep_dp_on_rank(case, cache) for case in cases]


def run_ep_dp_cases(
    cases: Sequence[EPDPCase], timeout: float = DEFAULT_TIMEOUT_S
) -> list[list[dict]]:
    """Start the ranks once and train every case; per case, its ranks' results (18)."""
    per_rank = spawn(ep_dp_rank, _world_size_for(cases), list(cases), timeout=timeout)
    return [[per_rank[rank][k] for rank in case.ranks] for k, case in enumerate(cases)]


def all_to_all_parity_rank(rank: int, world_size: int) -> dict[str, float]:
    """Rank function: the lesson's autograd all-to-all next to PyTorch's
    (torch.distributed.nn.functional.all_to_all_single) on uneven split sizes;
    the largest |difference| of the outputs and of the inputs' gradients (18)."""
    import warnings

    from torch.distributed.nn import functional as torch_functional

    torch.set_num_threads(1)
    send = [(rank + 2 * peer) % 3 for peer in range(world_size)]  # 0 rows sometimes
    receive = [(source + 2 * rank) % 3 for source in range(world_size)]
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(sum(send), 3, generator=generator, dtype=torch.float64)
    weights = torch.randn(sum(receive), 3, generator=generator, dtype=torch.float64)
    ours_in = x.clone().requires_grad_(True)
    ours = all_to_all(ours_in, receive, send)
    (ours * weights).sum().backward()
    theirs_in = x.clone().requires_grad_(True)
    with warnings.catch_warnings():  # deprecated for the private functional one
        warnings.simplefilter("ignore", FutureWarning)
        theirs = torch_functional.all_to_all_single(
            torch.empty_like(ours), theirs_in, receive, send
        )
    (theirs * weights).sum().backward()
    return {
        "output": (ours - theirs).abs().max().item() if ours.numel() else 0.0,
        "grad": (ours_in.grad - theirs_in.grad).abs().max().item()
        if x.numel()
        else 0.0,
        "rows": (sum(send), sum(receive)),
    }


def run_all_to_all_parity(
    world_size: int = 4, timeout: float = DEFAULT_TIMEOUT_S
) -> list[dict[str, float]]:
    """Start ``world_size`` ranks and compare the two autograd all-to-alls (18)."""
    return spawn(all_to_all_parity_rank, world_size, timeout=timeout)


def guessed_sizes_rank(
    rank: int, world_size: int, routes: Sequence[Sequence[int]], num_experts: int
) -> None:
    """Rank function: dispatch without exchanging counts, this rank's own input
    split sizes taken for what it receives; gloo aborts the ranks (18)."""
    torch.set_num_threads(1)
    experts = torch.tensor(routes[rank], dtype=torch.int64)
    counts = torch.bincount(experts, minlength=num_experts)
    sizes = counts.reshape(world_size, -1).sum(1).tolist()  # what this rank sends
    rows = torch.zeros(len(experts), 4)
    output = torch.empty(sum(sizes), 4)  # a guess: as much as it sends
    dist.all_to_all_single(output, rows, sizes, sizes)


def run_guessed_sizes(
    routes: Sequence[Sequence[int]],
    num_experts: int = 4,
    timeout: float = QUICK_TIMEOUT_S,
) -> None:
    """Start one rank per route and let them guess their output split sizes; the
    WorkerError keeps gloo's abort message, which does not reach the screen (18)."""
    saved, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)  # spawn passes the ranks' stderr on to this descriptor
    try:
        spawn(guessed_sizes_rank, len(routes), routes, num_experts, timeout=timeout)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


class SplitSizeError(RuntimeError):
    """The split sizes of an all-to-all do not match between the ranks (18)."""


def _split_message(
    stage: str,
    sizes: torch.Tensor,
    valid: torch.Tensor,
    dispatched: torch.Tensor | None,
) -> str:
    """One sentence on what is wrong with the ranks' split sizes, the same on every
    rank: ``sizes[rank]`` holds its (input, output) split sizes, ``valid[rank]``
    whether each list fits its tensor, ``dispatched`` the sizes of dispatch's last
    exchange."""
    world = len(sizes)
    sent, expected = sizes[:, 0], sizes[:, 1]  # sent[s, r], expected[r, s]
    if (
        stage == "combine"
        and dispatched is not None
        and torch.equal(sizes, dispatched)
        and not torch.equal(sent, sent.T)
    ):
        return (
            "in combine, every rank gives all_to_all_single the split sizes of "
            "dispatch in the same places: the outputs would travel on as the rows "
            "did, not back to the ranks they came from"
        )
    for side, what, tensor_is in (
        (0, "input", "the tensor it sends"),
        (1, "output", "its output tensor"),
    ):
        for rank in range(world):
            if not valid[rank, side]:
                return (
                    f"in {stage}, rank {rank}'s {what} split sizes are not one number "
                    f"per rank adding up to the rows of {tensor_is}"
                )
    rank = next(r for r in range(world) if not torch.equal(sent[:, r], expected[r]))
    own = torch.equal(expected[rank], sent[rank]) and not torch.equal(sent, sent.T)
    return (
        f"in {stage}, rank {rank} expects {expected[rank].tolist()} rows from ranks "
        f"0-{world - 1}, but they send it {sent[:, rank].tolist()}"
        + (
            ": it took its own input split sizes, what it sends, for what it receives"
            if own
            else ""
        )
    )


def _install_split_check(stage: list[str]) -> None:
    """Make every dist.all_to_all_single of this process first compare each rank's
    output split sizes with what the others send it, and raise the same
    SplitSizeError on every rank instead of letting gloo abort them."""
    original = dist.all_to_all_single
    dispatched: list[torch.Tensor] = []  # the sizes of dispatch's last exchange

    def checked(
        output, input, output_split_sizes=None, input_split_sizes=None, group=None,
        async_op=False,
    ):  # fmt: skip
        world = dist.get_world_size(group)

        def view(given, tensor) -> tuple[list[int], int]:
            rows = tensor.shape[0] if tensor.dim() else -1
            if given is None:
                given = [rows // world] * world if rows % world == 0 else []
            given = [int(n) for n in given]
            if len(given) != world:
                return [-1] * world, 0
            return given, int(sum(given) == rows and min(given) >= 0)

        (sent, sent_ok), (expected, expected_ok) = (
            view(input_split_sizes, input),
            view(output_split_sizes, output),
        )
        mine = torch.tensor([*sent, *expected, sent_ok, expected_ok])
        views = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(views, mine, group=group)
        everyone = torch.stack(views)  # (world, 2 * world + 2)
        sizes = everyone[:, : 2 * world].reshape(world, 2, world)
        valid = everyone[:, 2 * world :].bool()
        if not valid.all() or not torch.equal(sizes[:, 0].T, sizes[:, 1]):
            previous = dispatched[-1] if dispatched else None
            raise SplitSizeError(_split_message(stage[0], sizes, valid, previous))
        if stage[0] == "dispatch":
            dispatched.append(sizes)
        return original(
            output, input, output_split_sizes, input_split_sizes, group=group,
            async_op=async_op,
        )  # fmt: skip

    dist.all_to_all_single = checked


def _all_ok(ok: bool) -> bool:
    """Whether every rank is ok (a collective: every rank calls it)."""
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    return int(flag) == 0


def dispatch_exercise_rank(
    rank: int,
    world_size: int,
    dispatch: Callable,
    combine: Callable,
    problem: dict,
) -> dict:
    """Rank function for 18's checker: the learner's ``dispatch`` and ``combine``
    around this rank's experts (expert e multiplies its rows by matrices[e]), every
    all_to_all_single's split sizes checked first; returns the rows and counts
    dispatch gave this rank's experts, the combined rows and their gradients (18)."""
    torch.set_num_threads(1)
    stage = ["dispatch"]
    _install_split_check(stage)
    num_experts = problem["num_experts"]
    local = num_experts // world_size
    rows = problem["rows"][rank].clone().requires_grad_(True)
    grouped, per_expert, plan = dispatch(
        rows, problem["experts"][rank], num_experts, None
    )
    per_expert = [int(n) for n in per_expert]
    result: dict = {"per_expert": per_expert}
    shaped = isinstance(grouped, torch.Tensor)
    if shaped:
        result["received"] = grouped.detach().clone()
        shaped = len(per_expert) == local and sum(per_expert) == len(grouped)
        shaped = shaped and min(per_expert, default=0) >= 0
    if not _all_ok(shaped):
        return {**result, "problem": "counts"}
    matrices = problem["matrices"][rank * local : (rank + 1) * local]
    outputs = torch.cat(
        [chunk @ m for chunk, m in zip(grouped.split(per_expert), matrices)]
    )
    stage[0] = "combine"
    back = combine(outputs, plan, None)
    result["output"] = back.detach().clone()
    if not _all_ok(isinstance(back, torch.Tensor) and back.shape == rows.shape):
        return {**result, "problem": "output shape"}
    if not _all_ok(back.requires_grad):
        return {**result, "problem": "no graph"}
    stage[0] = "the backward pass"
    (back * problem["weights"][rank]).sum().backward()
    result["grad"] = None if rows.grad is None else rows.grad.clone()
    return result
