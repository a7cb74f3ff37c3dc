"""The checker of notebook 12's exercise 1, where the learner ports the Horovod-style
script to DDP (12).

The reference is what the Horovod-style script computes: one process on the global
batch (notebook 12 shows that 2 ranks give the same weights), trained here in the
notebook's process, so the check needs one launch only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, TensorDataset

from multigpu.core.compare import max_parameter_difference
from multigpu.core.models import ConvNet
from multigpu.runtime import launch

TOLERANCE = 1e-12  # float64: rounding differences stay near 1e-15


def _initial_weights(seed: int) -> dict[str, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return ConvNet().double().state_dict()


def one_process_run(
    X: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int, lr: float = 0.1
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


def check_port(
    main: Callable,
    X: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 2,
    batch_size: int = 32,
    world_size: int = 2,
) -> tuple[bool, str]:
    """Does the DDP port ``main(rank, world_size, X, y, epochs, batch_size)`` (e.g.
    ``my_port.main``) end where the Horovod-style script does? (passed, message
    naming the mistake) (12)."""
    try:
        results = launch.spawn(main, world_size, X, y, epochs, batch_size)
    except launch.WorkerError as error:
        last = str(error).strip().splitlines()[-1]
        return False, f"FAIL: your main raised on a rank: {last}"
    expected = _initial_weights(0).keys()
    keys = results[0].keys()
    if keys != expected and all(k.startswith("module.") for k in keys):
        return False, (
            "FAIL: the names start with 'module.': you returned the DDP wrapper's "
            "state_dict. Return model.module.state_dict(), the weights inside it."
        )
    if keys != expected:
        return False, "FAIL: return the ConvNet's state_dict (model.module's)."
    rank_0 = results[0]
    if any(max_parameter_difference(r, rank_0) > TOLERANCE for r in results[1:]):
        if all(_moved_like_rank_0(r, rank_0, s) for s, r in enumerate(results)):
            return False, (
                "FAIL: the ranks took the same steps from different weights: nothing "
                "gave them rank 0's. Wrap the model in DistributedDataParallel, which "
                "broadcasts rank 0's weights when it is built."
            )
        return False, (
            "FAIL: the ranks end with different weights: each trained alone. Wrap "
            "the model in DistributedDataParallel so gradients are averaged."
        )
    global_batch = batch_size * world_size
    if (
        max_parameter_difference(rank_0, one_process_run(X, y, epochs, global_batch))
        <= TOLERANCE
    ):
        return True, (
            f"PASS: your DDP port on {world_size} ranks ends with the weights of "
            f"the Horovod-style run (one process on the batch of {global_batch})."
        )
    if (
        max_parameter_difference(rank_0, one_process_run(X, y, epochs, batch_size))
        <= TOLERANCE
    ):
        return False, (
            "FAIL: every rank trained on every sample (the ranks agree, like one "
            f"process on batches of {batch_size}): give the DataLoader a "
            "DistributedSampler, so each rank takes its share."
        )
    return False, (
        "FAIL: the ranks agree but do not end where the Horovod-style run does: "
        "keep its model, seed, learning rate, batch size and loss."
    )
