"""What the ranks run: every worker that notebooks and tests pass to spawn (07).

A worker is called as ``worker(rank, world_size, *args)`` inside a process whose
process group is ready, and what it returns travels back to the caller. New
processes import it by module and name, so it cannot live in a notebook: the
workers of notebooks and tests live here (the per-rank entry point of a training
recipe stays in that recipe's module). Taught in
``notebooks/07_collectives_from_scratch.ipynb``; the tests of ``launch`` and
``collectives``, ``bench/allreduce.py`` and ``bench/orphans.py`` use them too.

Run as a module it is also the torchrun example of ``launch.run_torchrun``::

    torchrun --standalone --nproc-per-node=2 -m multigpu.workers

and, with ``ddp-exit [return|exit_rank]``, the demonstration of why a torchrun
script ends with :func:`multigpu.runtime.launch.exit_rank` (:func:`ddp_exit_demo`).
"""

from __future__ import annotations

import gc
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from multigpu.collectives import ALL_REDUCES, naive_all_reduce, ring_all_reduce
from multigpu.costmodel import bus_bandwidth, ring_bytes_per_rank

# ----------------------------------------------------------------------------------
# Ranks and processes: what launch.spawn does when all goes well, and when not


def whoami(rank: int, world_size: int) -> dict:
    """What one rank sees: its rank, the group size, backend and thread limits (07)."""
    return {
        "rank": rank,
        "world_size": world_size,
        "dist_rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def sum_of_ranks(rank: int, world_size: int, offset: int = 1) -> int:
    """all_reduce (rank + offset) over the group; every rank returns the sum (07)."""
    value = torch.tensor([rank + offset])
    dist.all_reduce(value)
    return int(value.item())


def environment_value(rank: int, world_size: int, name: str) -> str | None:
    """The value of environment variable ``name`` in this rank (tests of launch)."""
    return os.environ.get(name)


def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises ValueError; the others wait in a collective (07)."""
    dist.barrier()  # every rank has finished joining: the failure comes later
    if rank == bad_rank:
        raise ValueError(f"rank {rank} found a bad batch")
    return sum_of_ranks(rank, world_size)


def kill_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` dies from SIGKILL (like the out-of-memory killer) (07)."""
    dist.barrier()
    if rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return sum_of_ranks(rank, world_size)


def skip_collective(
    rank: int, world_size: int, absent_rank: int, sleep_s: float
) -> int:
    """Rank ``absent_rank`` sleeps instead of joining the all_reduce (07)."""
    if rank == absent_rank:
        time.sleep(sleep_s)
        return -1
    return sum_of_ranks(rank, world_size)


def wait_for_each_other(rank: int, world_size: int) -> int:
    """Every rank waits to receive from its neighbour and none sends: all time out
    (tests of launch)."""
    incoming = torch.zeros(1)
    dist.recv(incoming, src=(rank + 1) % world_size)
    return int(incoming.item())


def start_sleeper_then_fail(rank: int, world_size: int, pid_file: str) -> None:
    """Start a long-sleeping subprocess, record its pid in ``pid_file``, then raise
    (tests of launch)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(f"{pid_file}.{rank}", "w") as handle:
        handle.write(str(sleeper.pid))
    raise RuntimeError(f"rank {rank} failed after starting a subprocess")


def unpicklable_result(rank: int, world_size: int):
    """Returns something that cannot be sent back to the parent, a generator (tests
    of launch)."""
    return (i for i in range(3))


def join_late(rank: int, world_size: int, late_rank: int, delay_s: float) -> int:
    """Rank ``late_rank`` sleeps ``delay_s`` seconds before it joins the all_reduce:
    the others wait for it (tests of launch)."""
    if rank == late_rank:
        time.sleep(delay_s)
    return sum_of_ranks(rank, world_size)


def stuck_outside_collectives(
    rank: int, world_size: int, stuck_rank: int, busy: bool = False
) -> int:
    """Rank ``stuck_rank`` never returns: it loops forever outside any collective
    (at full CPU if ``busy``), which no timeout catches, only spawn's deadline; the
    others return their rank (07)."""
    while rank == stuck_rank:
        if not busy:
            time.sleep(0.05)
    return rank


def record_pid_and_spin(rank: int, world_size: int, pid_dir: str) -> None:
    """Write this process's pid to ``{pid_dir}/rank{rank}.pid``, then spin at full
    CPU forever outside any collective, like a runaway rank (tests of launch,
    bench/orphans.py: do the ranks end when their caller dies?)."""
    path = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(f"{path}.tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(f"{path}.tmp", path)  # whoever reads it never sees half a pid
    while True:
        pass


def exit_without_returning(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` ends its own process with ``os._exit(0)``: it neither
    returns nor raises (tests of launch)."""
    if rank == bad_rank:
        os._exit(0)
    return rank


class UnprintableError(Exception):
    """An exception whose text cannot be made: ``str()`` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be turned into text")


def raise_unprintable(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises an :class:`UnprintableError` (tests of launch)."""
    if rank == bad_rank:
        raise UnprintableError()
    return rank


def _refuse_to_unpickle() -> None:
    raise ValueError("this object cannot be rebuilt outside the rank")


class RefusesToUnpickle:
    """Pickles without complaint, but unpickling it raises ValueError."""

    def __reduce__(self):
        return (_refuse_to_unpickle, ())


def result_that_fails_to_unpickle(rank: int, world_size: int, bad_rank: int):
    """Rank ``bad_rank`` returns a :class:`RefusesToUnpickle`, which the parent
    cannot unpickle; the others return their rank (tests of launch)."""
    return RefusesToUnpickle() if rank == bad_rank else rank


def mismatched_shapes(rank: int, world_size: int) -> list[float]:
    """Each rank all-reduces a tensor of a different size, 4 * (rank + 1) elements:
    gloo aborts the process that receives more than it expects (tests of launch)."""
    tensor = torch.zeros(4 * (rank + 1))
    dist.all_reduce(tensor)
    return tensor.tolist()


# ----------------------------------------------------------------------------------
# Messages and all-reduce (collectives.py)


def ping_pong(rank: int, world_size: int, value: float) -> list[float]:
    """Rank 0 sends ``value`` to rank 1, which doubles it and sends it back; every
    rank returns what its tensor held at the end (07)."""
    tensor = torch.tensor([value if rank == 0 else 0.0])
    if rank == 0:
        dist.send(tensor, dst=1)  # blocks until rank 1 has taken it
        dist.recv(tensor, src=1)  # ... and waits for the answer
    elif rank == 1:
        dist.recv(tensor, src=0)
        tensor *= 2
        dist.send(tensor, dst=0)
    return tensor.tolist()


def rank_tensor(rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A deterministic, rank-dependent input for comparisons, values 0..99 + rank
    (07)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    values = torch.randint(0, 100, tuple(shape), generator=generator) + rank
    if dtype.is_floating_point:
        return values.to(dtype) / 7  # not exactly representable: rounding shows
    return values.to(dtype)


def _device() -> torch.device:
    """Where this rank's tensors live: its GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def compare_all_reduces(
    rank: int, world_size: int, cases: Sequence[tuple[tuple[int, ...], torch.dtype]]
) -> list[dict]:
    """For each (shape, dtype): the result and the bytes sent of every all-reduce in
    ``collectives.ALL_REDUCES`` on the same input (07)."""
    rows = []
    for shape, dtype in cases:
        row = {"shape": tuple(shape), "dtype": dtype}
        for name, all_reduce in ALL_REDUCES.items():
            tensor = rank_tensor(rank, shape, dtype).to(_device())
            row[f"{name} bytes"] = all_reduce(tensor)
            row[name] = tensor.cpu()
        rows.append(row)
    return rows


# What check_all_reduce tries: many elements, fewer elements than ranks, 2-D, integers.
CHECK_CASES = (
    ((1000,), torch.float32),
    ((3,), torch.float32),
    ((4, 5), torch.float64),
    ((13,), torch.int64),
)


def check_all_reduce(
    rank: int,
    world_size: int,
    all_reduce: Callable[[torch.Tensor], object],
    cases: Sequence[tuple[tuple[int, ...], torch.dtype]] = CHECK_CASES,
) -> list[dict]:
    """Check an all-reduce written by the learner, e.g. ``my_ring.ring_all_reduce``
    from a module the notebook wrote, against ``dist.all_reduce`` (07).

    For each (shape, dtype), every rank runs ``all_reduce`` on its ``rank_tensor``
    (in place, like ``dist.all_reduce``) and the row says whether every rank then
    holds the sum (floats to rounding, integers exactly) and whether every rank
    returned the bytes a ring sends (``costmodel.ring_bytes_per_rank``). Every rank
    returns the same rows."""
    rows = []
    for shape, dtype in cases:
        tensor = rank_tensor(rank, shape, dtype).to(_device())
        expected = tensor.clone()
        dist.all_reduce(expected)
        sent = all_reduce(tensor)
        same = tensor.shape == expected.shape and tensor.dtype == expected.dtype
        if same and dtype.is_floating_point:
            same = torch.allclose(tensor, expected)
        elif same:
            same = torch.equal(tensor, expected)
        ring = ring_bytes_per_rank(
            tensor.numel(), tensor.element_size(), world_size, rank
        )
        ring_bytes = isinstance(sent, int) and sent == ring
        verdict = torch.tensor([int(same), int(ring_bytes)], device=_device())
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)  # 1 only if 1 on every rank
        rows.append(
            {
                "case": f"{tuple(shape)} {str(dtype).removeprefix('torch.')}",
                "sum": bool(verdict[0]),
                "ring bytes": bool(verdict[1]),
            }
        )
    return rows


def transposed_all_reduce(rank: int, world_size: int) -> dict:
    """The hand-written all-reduces of a non-contiguous (transposed) tensor, and
    ``dist.all_reduce``'s sum as "expected" (tests of collectives)."""
    base = rank_tensor(rank, (3, 5), torch.float32)
    expected = base.clone()
    dist.all_reduce(expected)
    row = {"expected": expected.t()}
    for name in ("naive", "ring", "ring pipelined"):
        tensor = base.clone().t()  # (5, 3), not contiguous
        ALL_REDUCES[name](tensor)
        row[name] = tensor
    return row


def bytes_sent(rank: int, world_size: int, numel: int) -> dict:
    """Bytes this rank sends in naive and ring all-reduce of ``numel`` float32 (07)."""
    tensor = torch.ones(numel)
    return {
        "rank": rank,
        "naive": naive_all_reduce(tensor.clone()),
        "ring": ring_all_reduce(tensor.clone()),
    }


def time_all_reduces(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    repeats: int = 5,
    names: Sequence[str] = tuple(ALL_REDUCES),
) -> list[dict]:
    """Median seconds (of the slowest rank) of each named all-reduce for float32
    tensors of the given sizes; rows with bytes sent and bus bandwidth (07,
    bench/allreduce.py).

    The methods take turns within each repeat, so a burst of load on the machine
    hits all of them alike; repeat 0 only warms up connections and buffers.
    """
    rows = []
    for nbytes in sizes_bytes:
        source = torch.ones(nbytes // 4, device=_device())
        seconds: dict[str, list[float]] = {name: [] for name in names}
        sent: dict[str, int | None] = {}
        for repeat in range(repeats + 1):
            for name in names:
                tensor = source.clone()
                dist.barrier()
                start = time.perf_counter()
                sent[name] = ALL_REDUCES[name](tensor)
                if tensor.is_cuda:
                    torch.cuda.synchronize()
                elapsed = torch.tensor([time.perf_counter() - start], device=_device())
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if repeat:
                    seconds[name].append(elapsed.item())
        for name in names:
            median = statistics.median(seconds[name])
            rows.append(
                {
                    "algorithm": name,
                    "world_size": world_size,
                    "bytes": nbytes,
                    "bytes sent": sent[name],  # by this rank
                    "seconds": median,
                    "busbw GB/s": bus_bandwidth(nbytes, median, world_size) / 1e9,
                }
            )
    return rows


def scaling_measurements(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    per_rank_batch: int = 32,
    steps: int = 20,
    repeats: int = 5,
) -> dict:
    """What notebook 12's cost model is fitted to and checked against, measured in
    one launch: ``dist.all_reduce`` times at ``sizes_bytes`` (none on one rank), then
    the median step time of ``model`` under DDP with its all-reduce ("synced") and
    without it ("no_sync") (12)."""
    from multigpu.ddp import (
        step_times,  # here: importing ddp slows every rank's start by ~2 s
    )

    rows = []
    if world_size > 1:
        rows = time_all_reduces(
            rank, world_size, sizes_bytes, repeats, names=("dist.all_reduce",)
        )
    step = step_times(rank, world_size, per_rank_batch, steps, model, input_shape)
    return {"all_reduce": rows, "step": step}


# ----------------------------------------------------------------------------------
# Training steps for allreduce_sgd.check_step: one written by hand as notebook 08's
# exercise asks, and mistakes it must name. Each has sgd_step's signature; ``config``
# (a TrainConfig) is not used. (tests of allreduce_sgd)


def step_all_reducing_each_gradient(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Correct: one ``dist.all_reduce`` per gradient, then divide by the world size."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)  # mean over this batch
    loss.backward()
    if distributed:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  # the sum over the ranks
            parameter.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def step_without_all_reduce(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: every rank steps with its own gradient, so the ranks drift apart."""
    return step_all_reducing_each_gradient(model, optimizer, X, y, config)


def step_summing_without_dividing(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: the gradients are summed over the ranks but never divided."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    if distributed:
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
    optimizer.step()
    return loss.item()


def step_returning_the_ranks_summed_loss(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    X: torch.Tensor,
    y: torch.Tensor,
    config: object,
    distributed: bool = False,
) -> float:
    """Mistake: trains correctly, but returns the loss summed over the ranks."""
    loss = step_all_reducing_each_gradient(model, optimizer, X, y, config, distributed)
    if not distributed:
        return loss
    total = torch.tensor([loss])
    dist.all_reduce(total)
    return total.item()


# ----------------------------------------------------------------------------------
# torchrun: each rank runs this module's main()


def main() -> None:
    """torchrun entry: every rank adds rank + 1; rank 0 prints the sum (tests of
    launch.run_torchrun)."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    total = sum_of_ranks(rank, world_size)
    if rank == 0:
        print(f"world_size={world_size} sum={total} threads={torch.get_num_threads()}")
    dist.destroy_process_group()


def native_threads() -> int | None:
    """The threads of this process, C++ ones included (Linux), else None."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def ddp_exit_demo() -> None:
    """torchrun entry (``-m multigpu.workers ddp-exit return|exit_rank``): build a
    DDP model, train one step, drop it and collect garbage, all_gather, then
    ``destroy_process_group()`` and end at once, as a training script does. Rank 0
    prints the process's native threads before joining, in the group, and after
    destroying it: once DDP was built, the gloo threads outlive the group, which
    is why a torchrun script ends with :func:`multigpu.runtime.launch.exit_rank` (tests and
    ``bench/exit_abort.py``)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.ones(2).sum()  # start torch's own threads before the first count
    before = native_threads()
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    model(torch.randn(4, 8)).sum().backward()
    del model
    gc.collect()
    mine = torch.ones(2, dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    during = native_threads()
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(
            f"native threads: {before} before, {during} in the group, "
            f"{native_threads()} after destroy_process_group",
            flush=True,
        )


if __name__ == "__main__":
    from multigpu.runtime.launch import exit_rank

    if sys.argv[1:2] == ["ddp-exit"]:
        ending = sys.argv[2] if len(sys.argv) > 2 else "exit_rank"
        ddp_exit_demo()
        if ending == "exit_rank":
            exit_rank(0)
    else:
        main()
        exit_rank(0)
