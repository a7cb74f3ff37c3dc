"""Hand-written scatters that learners write in notebook 02's exercise 3, each with
one mistake (tests/exercises/test_dataparallel.py)."""

import math

from multigpu import dataparallel as dp


def as_shipped(X, devices):
    """The exercise's TODOs left as they are."""
    chunks = []
    return tuple(chunks)


def balanced(X, devices):
    """As even as possible (3, 3, 2, 2 for 10 on 4), as tensor_split cuts."""
    return tuple(
        dp.to_device(chunk, device)
        for chunk, device in zip(X.tensor_split(len(devices)), devices)
    )


def floor_then_rest(X, devices):
    """B // n rows each, the last chunk takes the remainder (2, 2, 2, 4)."""
    size, n = len(X) // len(devices), len(devices)
    starts = [i * size for i in range(n)] + [len(X)]
    return tuple(
        dp.to_device(X[starts[i] : starts[i + 1]], devices[i])
        for i in range(n)
        if starts[i + 1] > starts[i]
    )


def empty_chunks(X, devices):
    """One chunk per device, even an empty one."""
    size = math.ceil(len(X) / len(devices))
    return tuple(
        dp.to_device(X[i * size : (i + 1) * size], device)
        for i, device in enumerate(devices)
    )


def round_robin(X, devices):
    """Deals the rows out like cards: chunk i holds rows i, i + n, ..."""
    n = len(devices)
    return tuple(dp.to_device(X[i::n], devices[i]) for i in range(min(n, len(X))))


def not_moved(X, devices):
    """The right chunks, left where the batch is."""
    size = math.ceil(len(X) / len(devices))
    return tuple(X[start : start + size] for start in range(0, len(X), size))


def all_on_the_first(X, devices):
    """The right chunks, all copied to the first device."""
    size = math.ceil(len(X) / len(devices))
    return tuple(
        dp.to_device(X[start : start + size], devices[0])
        for start in range(0, len(X), size)
    )


def detached(X, devices):
    """The right chunks, cut from a detached batch."""
    size = math.ceil(len(X) / len(devices))
    rows = X.detach()
    return tuple(
        dp.to_device(rows[start : start + size], devices[start // size])
        for start in range(0, len(X), size)
    )


def a_generator(X, devices):
    """Returns a generator instead of the chunks."""
    size = math.ceil(len(X) / len(devices))
    return (
        dp.to_device(X[start : start + size], devices[start // size])
        for start in range(0, len(X), size)
    )


def floor_size(X, devices):
    """B // n rows per chunk: more chunks than devices when n does not divide B."""
    size = len(X) // len(devices)
    return tuple(
        dp.to_device(X[start : start + size], devices[index])
        for index, start in enumerate(range(0, len(X), size))
    )
