"""The checker of notebook 12's exercise 2, where the learner ports the Horovod-style
script to DDP (12).

The reference is what the Horovod-style script computes: one process on the global
batch (notebook 12 shows that 2 ranks give the same weights), trained here in the
notebook's process, so the check needs one launch only. A port that ends elsewhere is
compared with what each mistake learners make trains (a learning rate or a batch
scaled by the world size, no sampler), so that the message names the one it made.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, TensorDataset

from multigpu.core.compare import max_parameter_difference
from multigpu.core.models import ConvNet
from multigpu.exercises._learner_code import last_line
from multigpu.exercises._result import ExerciseResult, fail, ok
from multigpu.runtime import launch

TOLERANCE = 1e-12  # float64: rounding differences stay near 1e-15
LR = 0.1  # the Horovod-style script's learning rate


def _initial_weights(seed: int) -> dict[str, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ConvNet().double().state_dict()


def one_process_run(
    X: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int, lr: float = LR
) -> dict[str, torch.Tensor]:
    """The weights of the script's training in one process, rank 0's seed, batches
    of ``batch_size`` in order (12)."""
    model = ConvNet().double()
    model.load_state_dict(_initial_weights(0))
    loader = DataLoader(TensorDataset(X, y), batch_size=batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
    return model.state_dict()


def _moved_like_rank_0(result: dict, rank_0: dict, seed: int) -> bool:
    """Did this rank take the same steps as rank 0 from its own initial weights?"""
    start, start_0 = _initial_weights(seed), _initial_weights(0)
    return all(
        torch.allclose(result[k] - start[k], rank_0[k] - start_0[k], atol=1e-9)
        for k in rank_0
    )


def _uses_a_sampler(main: Callable) -> bool | None:
    """Does the module that defines ``main`` name DistributedSampler? None if its
    source cannot be read."""
    try:
        return "DistributedSampler" in inspect.getsource(inspect.getmodule(main))
    except (OSError, TypeError):
        return None


def _diagnose_agreeing_ranks(
    main: Callable, rank_0: dict, X, y, epochs: int, batch_size: int, n: int
) -> str:
    """The FAIL message for ranks that agree but do not end where the script does:
    the mistake whose training gives their weights."""

    def trains_like(batch: int, lr: float = LR) -> bool:
        run = one_process_run(X, y, epochs, batch, lr)
        return max_parameter_difference(rank_0, run) <= TOLERANCE

    global_batch = batch_size * n
    if trains_like(global_batch, LR * n):
        return (
            "FAIL: the ranks train like one process on the global batch with every "
            f"step {n} times too large: the learning rate times the world size "
            f"({LR * n:g} instead of {LR:g}), or the ranks' gradients summed "
            "instead of averaged. The Horovod-style script does not scale its "
            "learning rate, and DDP averages the gradients, so the port needs "
            "neither."
        )
    if trains_like(global_batch, LR / n):
        return (
            "FAIL: the ranks train like one process on the global batch with the "
            f"learning rate divided by the world size ({LR / n:g} instead of "
            f"{LR:g}): every step is {n} times too small. DDP already averages the "
            "gradients; the script's learning rate stays as it is."
        )
    if trains_like(global_batch * n):
        return (
            f"FAIL: each rank takes batches of {global_batch}, the script's "
            "batch_size times the world size, so the ranks together train on "
            f"batches of {global_batch * n}. In the script batch_size is per rank "
            f"already: the global batch is {global_batch}."
        )
    if trains_like(batch_size):
        if _uses_a_sampler(main) is False:
            return (
                "FAIL: every rank trained on every sample (the ranks agree, like "
                f"one process on batches of {batch_size}): without a "
                "DistributedSampler each rank's DataLoader reads the whole data "
                "set, so the ranks repeat each other's work instead of sharing it."
            )
        return (
            "FAIL: the ranks agree, like one process on batches of "
            f"{batch_size}, not {global_batch}: each rank took batch_size divided "
            "by the world size, or read every sample (no DistributedSampler). In "
            f"the script batch_size is per rank: {n} ranks take {global_batch} "
            "samples per step."
        )
    return (
        "FAIL: the ranks agree but do not end where the Horovod-style run does, "
        "and not as a learning rate or a batch scaled by the world size would: "
        "compare your model, seed, loss and loop with the script's."
    )


def check_port(
    main: Callable,
    X: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 2,
    batch_size: int = 32,
    world_size: int = 2,
    timeout: float = launch.DEFAULT_TIMEOUT_S,
) -> ExerciseResult:
    """Does the DDP port ``main(rank, world_size, X, y, epochs, batch_size)`` (e.g.
    ``my_port.main``) end where the Horovod-style script does? (passed, message
    naming the mistake) (12). ``timeout``: seconds a rank waits in a collective."""
    try:
        results = launch.spawn(
            main, world_size, X, y, epochs, batch_size, timeout=timeout
        )
    except launch.WorkerError as error:
        said = f"{error}\n{error.traceback}".lower()
        if error.timed_out or "closed by peer" in said or "reset by peer" in said:
            return fail(
                "FAIL: the ranks waited for each other until the timeout, or until "
                "one of them returned: a collective (building DDP broadcasts; every "
                "backward all-reduces) ran on some ranks and not on the others."
            )
        return fail(f"FAIL: your main raised on a rank: {last_line(error)}")
    expected = _initial_weights(0).keys()
    keys = results[0].keys()
    if keys != expected and all(k.startswith("module.") for k in keys):
        return fail(
            "FAIL: the names start with 'module.': you returned the DDP wrapper's "
            "state_dict. The check compares the ConvNet's own weights, those of "
            "the model inside the wrapper (its module)."
        )
    if keys != expected:
        return fail(
            "FAIL: the names you returned are not the ConvNet's: return the "
            "state_dict of the ConvNet you trained."
        )
    rank_0 = results[0]
    if any(max_parameter_difference(r, rank_0) > TOLERANCE for r in results[1:]):
        if all(_moved_like_rank_0(r, rank_0, s) for s, r in enumerate(results)):
            return fail(
                "FAIL: the ranks took the same steps from different weights: "
                "nothing gave them rank 0's. DistributedDataParallel broadcasts "
                "rank 0's weights when it is built; gradients averaged by hand do "
                "not."
            )
        return fail(
            "FAIL: the ranks end with different weights: each trained alone, as "
            "nothing averaged the gradients (that is what the DDP wrapper does "
            "during backward)."
        )
    global_batch = batch_size * world_size
    if (
        max_parameter_difference(rank_0, one_process_run(X, y, epochs, global_batch))
        <= TOLERANCE
    ):
        return ok(
            f"PASS: your DDP port on {world_size} ranks ends with the weights of "
            f"the Horovod-style run (one process on the batch of {global_batch})."
        )
    return fail(
        _diagnose_agreeing_ranks(main, rank_0, X, y, epochs, batch_size, world_size)
    )
