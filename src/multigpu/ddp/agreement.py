"""The torchrun script's last check: every rank ends with the same weights, and
they are numbers (09).

DDP keeps the ranks' weights equal bit for bit; if they differ at the end, the
ranks did not train one model, and the run fails. Each rank hashes every tensor of
its weights (SHA-256 of the bytes, so nan compares equal to the same nan), the
ranks exchange the hashes, and rank 0 names the first tensor that differs and the
ranks whose copy is not rank 0's. Weights that agree but hold nan or inf fail too:
training diverged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

AGREE = "every rank holds the same weights: True"  # what rank 0 prints when all is well


class WeightsDifferError(RuntimeError):
    """The ranks ended with different weights, or with weights that are not finite;
    the message is the one line the script prints (09)."""


def tensor_digests(parameters: Mapping[str, torch.Tensor]) -> list[str]:
    """The SHA-256 of each tensor's bytes, in the order of ``parameters`` (09)."""
    digests = []
    for tensor in parameters.values():
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digests.append(hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest())
    return digests


def weights_disagreement(
    names: Sequence[str], digests_by_rank: Sequence[Sequence[str]]
) -> str | None:
    """The line that says how the ranks' weights differ: the first tensor whose
    hash is not rank 0's on some rank, and those ranks; None if every rank holds
    the same (09)."""
    reference = digests_by_rank[0]
    differing = [
        i
        for i, digest in enumerate(reference)
        if any(other[i] != digest for other in digests_by_rank[1:])
    ]
    if not differing:
        return None
    first = differing[0]
    ranks = [
        r for r, other in enumerate(digests_by_rank) if other[first] != reference[first]
    ]
    return (
        f"every rank holds the same weights: False: {names[first]} differs between "
        f"rank 0 and rank(s) {', '.join(map(str, ranks))} (the first of "
        f"{len(differing)} differing tensor(s) of {len(names)}), so the ranks did not "
        "train one model and none of their weights is the run's result. Run again; "
        "if it happens again, check that every rank reads the same data and snapshot."
    )


def not_finite(parameters: Mapping[str, torch.Tensor]) -> str | None:
    """The line that says the weights hold nan or inf, naming the first such
    tensor; None if every value is finite (09)."""
    for name, tensor in parameters.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return (
                "every rank holds the same weights: True, but they are not finite "
                f"(nan or inf, first in {name}): training diverged. Run again with a "
                "smaller --lr (in a new snapshot folder, if the run used one)."
            )
    return None


def check_same_weights(parameters: Mapping[str, torch.Tensor]) -> None:
    """Every rank calls it (a collective) with its final weights; raise
    :class:`WeightsDifferError` on every rank if they differ between ranks or are
    not finite (09)."""
    digests = tensor_digests(parameters)
    gathered: list[list[str] | None] = [digests]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, digests)
    problem = weights_disagreement(list(parameters), gathered)  # type: ignore[arg-type]
    problem = problem or not_finite(parameters)
    if problem is not None:
        raise WeightsDifferError(problem)
