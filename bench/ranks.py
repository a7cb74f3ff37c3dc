"""Rank functions only the benchmarks use."""

from __future__ import annotations

import os
import re


def record_pid_and_spin_rank(rank: int, world_size: int, pid_dir: str) -> None:
    """Write this process's pid to ``{pid_dir}/rank{rank}.pid``, then spin at full
    CPU forever outside any collective, like a runaway rank (tests of launch,
    bench/orphans.py: do the ranks end when their caller dies?)."""
    path = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(f"{path}.tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(f"{path}.tmp", path)  # whoever reads it never sees half a pid
    while True:
        pass


def hold_the_gil_rank(rank: int, world_size: int, pid_dir: str) -> None:
    """Write this process's pid as :func:`record_pid_and_spin_rank` does, then run one
    regular expression that backtracks for years: a single C call that holds the
    GIL, so no other thread of the rank (its lifeline) can run."""
    path = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(f"{path}.tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(f"{path}.tmp", path)
    re.match(r"(a+)+$", "a" * 64 + "!")  # 2**64 ways to split the a's: never ends


def one_training_step_rank(rank: int, world_size: int) -> float:
    """Build a small model and an SGD optimizer, take one step with the gradients
    all-reduced, and return the CPU-seconds this process has used since it was
    forked (bench/launch_cost.py)."""
    import resource

    import torch
    import torch.distributed as dist

    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
