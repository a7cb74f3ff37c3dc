"""Fits of the ring model's α and B that learners write for notebook 12's exercise 1,
right and wrong."""

import torch


def _solve(rows, messages, sent, dtype=torch.float64):
    """Least squares of t = messages(n)·α + sent(S, n)·(1/B): (α, B)."""
    A = torch.tensor(
        [[messages(r["world_size"]), sent(r["bytes"], r["world_size"])] for r in rows],
        dtype=dtype,
    )
    t = torch.tensor([[r["seconds"]] for r in rows], dtype=dtype)
    alpha, inverse_bandwidth = torch.linalg.lstsq(A, t).solution.flatten().tolist()
    return alpha, 1 / inverse_bandwidth


def _ring_messages(n):
    return 2 * (n - 1)


def _ring_bytes(size, n):
    return 2 * (n - 1) / n * size


def right(rows):
    return _solve(rows, _ring_messages, _ring_bytes)


def right_by_normal_equations(rows):
    """Correct too: the 2 x 2 normal equations in plain Python."""
    a = [2 * (r["world_size"] - 1) for r in rows]
    b = [2 * (r["world_size"] - 1) / r["world_size"] * r["bytes"] for r in rows]
    t = [r["seconds"] for r in rows]
    saa = sum(x * x for x in a)
    sab = sum(x * y for x, y in zip(a, b))
    sbb = sum(y * y for y in b)
    sat = sum(x * z for x, z in zip(a, t))
    sbt = sum(y * z for y, z in zip(b, t))
    det = saa * sbb - sab * sab
    return (sat * sbb - sbt * sab) / det, det / (saa * sbt - sab * sat)


def float32(rows):
    return _solve(rows, _ring_messages, _ring_bytes, dtype=torch.float32)


def one_message(rows):
    """α as if the all-reduce were one message."""
    return _solve(rows, lambda n: 1, _ring_bytes)


def one_phase_of_messages(rows):
    """Counted the reduce-scatter's n-1 messages only."""
    return _solve(rows, lambda n: n - 1, _ring_bytes)


def whole_tensor(rows):
    """Each rank sends S, as if the tensor went once, whole."""
    return _solve(rows, _ring_messages, lambda size, n: size)


def one_phase_of_bytes(rows):
    """(n-1)/n·S: the bytes of one phase."""
    return _solve(rows, _ring_messages, lambda size, n: (n - 1) / n * size)


def swapped(rows):
    alpha, bandwidth = right(rows)
    return bandwidth, alpha


def beta(rows):
    alpha, bandwidth = right(rows)
    return alpha, 1 / bandwidth


def no_model_at_all(rows):
    """Section 2's numbers copied, not fitted."""
    return 203e-6, 1.57e9


def indexes_a_list(rows):
    """Treated each row as a list (bytes, world size, seconds)."""
    return _solve(rows, lambda n: 2 * (n - 1), lambda size, n: size)[0], rows[0][2]
