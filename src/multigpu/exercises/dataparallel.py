"""The checker of notebook 02's exercise 3, where the learner writes the chunking of
``scatter`` by hand: ``my_scatter(X, devices)`` cuts a batch into the chunks
DataParallel sends to each device (02)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from multigpu.core.devices import simulated_devices
from multigpu.dataparallel import device_of, scatter
from multigpu.exercises._result import ExerciseResult, fail, ok

# (batch size, devices): uneven splits, fewer chunks than devices, one row
CASES = [(12, 4), (10, 4), (5, 4), (4, 3), (7, 3), (9, 4), (1, 4), (6, 1), (13, 2)]


def _batch(batch_size: int) -> torch.Tensor:
    """Rows that say where they came from: row i is (i, i + 0.5)."""
    rows = torch.arange(batch_size, dtype=torch.float32)
    return torch.stack([rows, rows + 0.5], dim=1).requires_grad_()


def _sizes_message(sizes: list[int], expected: list[int], setting: str) -> str:
    """Why chunks of ``sizes`` are not DataParallel's ``expected`` ones."""
    start = f"FAIL: {setting} you cut chunks of {sizes}; DataParallel cuts {expected}."
    if sum(sizes) != sum(expected):
        return (
            f"{start} Your chunks hold {sum(sizes)} rows of the batch's "
            f"{sum(expected)}: every row goes to exactly one chunk."
        )
    if 0 in sizes:
        return (
            f"{start} A device with no rows gets no chunk at all, not an empty one: "
            "scatter then returns fewer chunks than devices, and DataParallel runs "
            "fewer replicas (notebook 04 shows where that matters)."
        )
    if len(sizes) >= len(expected) and max(sizes) - min(sizes) <= 1:
        return (
            f"{start} Spreading the rows as evenly as possible is not how tensor.chunk "
            "cuts: every chunk but the last has the same size, the largest, and the "
            "last takes what is left (section 2)."
        )
    if sizes[-1] > sizes[0]:
        return (
            f"{start} Your last chunk is the largest: every chunk but the last has the "
            "same size, the largest, and the last takes what is left (section 2)."
        )
    return f"{start} Every chunk but the last has the same size (section 2)."


def check_scatter(my_scatter: Callable) -> ExerciseResult:
    """Does ``my_scatter(X, devices)`` cut ``X`` along dimension 0 into the chunks
    ``dp.scatter`` makes, each on its device, with the gradient flowing back?
    (passed, message) (02)."""
    for batch_size, device_count in CASES:
        devices = simulated_devices(device_count)
        setting = f"for a batch of {batch_size} on {device_count} device(s)"
        X = _batch(batch_size)
        expected = scatter(X.detach(), devices)
        try:
            chunks = my_scatter(X, devices)
        except Exception as error:  # the learner's code: any error is a FAIL
            return fail(
                f"FAIL: {setting} your function raised {type(error).__name__}: {error}"
            )
        if not isinstance(chunks, (list, tuple)) or not all(
            isinstance(chunk, torch.Tensor) for chunk in chunks
        ):
            return fail(
                f"FAIL: {setting} your function returned a {type(chunks).__name__}, "
                "not a tuple of tensors: return the chunks, one tensor per device "
                "that gets rows."
            )
        sizes = [len(chunk) for chunk in chunks]
        expected_sizes = [len(chunk) for chunk in expected]
        if sizes != expected_sizes:
            return fail(_sizes_message(sizes, expected_sizes, setting))
        for index, (chunk, reference) in enumerate(zip(chunks, expected)):
            if chunk.shape != reference.shape or not torch.equal(
                chunk.detach(), reference
            ):
                rows = [round(value) for value in chunk.detach()[:, 0].tolist()]
                return fail(
                    f"FAIL: {setting} chunk {index} holds rows {rows} of the batch: "
                    "each chunk is one consecutive block of whole rows, in order, so "
                    "chunk 0 holds the first rows."
                )
            where = device_of(chunk)
            if where.name != devices[index].name:
                return fail(
                    f"FAIL: {setting} chunk {index} is on {where}, not on "
                    f"{devices[index]}: chunk i must be copied to device i "
                    "(look at to_device)."
                )
        if not all(chunk.requires_grad for chunk in chunks):
            return fail(
                f"FAIL: {setting} your chunks are cut off from the batch's autograd "
                "graph, so no gradient could flow back to the inputs: cut and copy "
                "with differentiable operations, without detaching."
            )
        sum(chunk.sum() for chunk in chunks).backward()
        if X.grad is None or not torch.equal(X.grad, torch.ones_like(X)):
            return fail(
                f"FAIL: {setting} the gradient does not reach every row of the batch "
                "exactly once through your chunks."
            )
    return ok(
        f"PASS: your chunks match scatter's for {len(CASES)} batches on 1 to 4 "
        "devices: the same sizes (fewer chunks than devices for small batches), the "
        "same rows, each chunk on its device, the gradient flowing back to the batch."
    )
