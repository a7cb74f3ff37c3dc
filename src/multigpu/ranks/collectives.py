"""The functions the ranks of notebook 07 run: who am I, a sum over the ranks, ranks
that fail, die, skip or hang, messages, and all-reduce checks, counts and timings.

Each is called as ``fn(rank, world_size, *args)`` inside a process whose process
group is ready (:func:`multigpu.runtime.launch.spawn`), and what it returns travels
back to the caller. New processes import it by module and name, so it cannot live
in a notebook. Taught in ``notebooks/07_collectives_from_scratch.ipynb``; the tests
of ``launch`` and ``collectives`` and ``bench/allreduce.py`` use them too.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from multigpu.collectives import ALL_REDUCES, naive_all_reduce, ring_all_reduce
from multigpu.costmodel import bus_bandwidth

# ----------------------------------------------------------------------------------
# Ranks and processes: what launch.spawn does when all goes well, and when not


def whoami_rank(rank: int, world_size: int) -> dict:
    """What one rank sees: its rank, the group size, backend and thread limits (07)."""
    return {
        "rank": rank,
        "world_size": world_size,
        "dist_rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def sum_of_ranks_rank(rank: int, world_size: int, offset: int = 1) -> int:
    """all_reduce (rank + offset) over the group; every rank returns the sum (07)."""
    value = torch.tensor([rank + offset])
    dist.all_reduce(value)
    return int(value.item())


def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises ValueError; the others wait in a collective (07)."""
    dist.barrier()  # every rank has finished joining: the failure comes later
    if rank == bad_rank:
        raise ValueError(f"rank {rank} found a bad batch")
    return sum_of_ranks_rank(rank, world_size)


def kill_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` dies from SIGKILL (like the out-of-memory killer) (07)."""
    dist.barrier()
    if rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return sum_of_ranks_rank(rank, world_size)


def skip_collective_rank(
    rank: int, world_size: int, absent_rank: int, sleep_s: float
) -> int:
    """Rank ``absent_rank`` sleeps instead of joining the all_reduce (07)."""
    if rank == absent_rank:
        time.sleep(sleep_s)
        return -1
    return sum_of_ranks_rank(rank, world_size)


def stuck_outside_collectives_rank(
    rank: int, world_size: int, stuck_rank: int, busy: bool = False
) -> int:
    """Rank ``stuck_rank`` never returns: it loops forever outside any collective
    (at full CPU if ``busy``), which no timeout catches, only spawn's deadline; the
    others return their rank (07)."""
    while rank == stuck_rank:
        if not busy:
            time.sleep(0.05)
    return rank


# ----------------------------------------------------------------------------------
# Messages and all-reduce (multigpu.collectives)


def ping_pong_rank(rank: int, world_size: int, value: float) -> list[float]:
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


def compare_all_reduces_rank(
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


# What check_all_reduce_rank tries: many elements, fewer than ranks, 2-D, integers.
CHECK_CASES = (
    ((1000,), torch.float32),
    ((3,), torch.float32),
    ((4, 5), torch.float64),
    ((13,), torch.int64),
)


def sent_by_every_rank(sent: object) -> list[int | None]:
    """What every rank's all-reduce returned as its bytes sent, in rank order (a
    collective: every rank calls it); None where a rank returned no int (07)."""
    counted = isinstance(sent, int) and not isinstance(sent, bool) and sent >= 0
    mine = torch.tensor([sent if counted else -1], device=_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [None if value.item() < 0 else int(value.item()) for value in every]


def is_ring_traffic(sent: Sequence[int | None], numel: int, element_size: int) -> bool:
    """Do the bytes each rank sent (``sent``, in rank order) fit a ring all-reduce of
    ``numel`` elements, whatever chunk each rank finishes (07)?

    In any ring every chunk travels n-1 hops in the reduce-scatter and n-1 in the
    all-gather, so the ranks together send 2(n-1)·S; each rank skips two chunks and
    sends less than 2·S (naive's rank 0 sends (n-1)·S). Which chunks a rank skips
    depends on the ring's schedule, so the per-rank counts are not fixed."""
    world_size, nbytes = len(sent), numel * element_size
    if any(value is None for value in sent):
        return False
    if world_size == 1:
        return sent == [0]
    total = 2 * (world_size - 1) * nbytes
    return sum(sent) == total and all(value < 2 * nbytes for value in sent)


def check_all_reduce_rank(
    rank: int,
    world_size: int,
    all_reduce: Callable[[torch.Tensor], object],
    cases: Sequence[tuple[tuple[int, ...], torch.dtype]] = CHECK_CASES,
) -> list[dict]:
    """Check an all-reduce written by the learner, e.g. ``my_ring.ring_all_reduce``
    from a module the notebook wrote, against ``dist.all_reduce`` (07).

    For each (shape, dtype), every rank runs ``all_reduce`` on its ``rank_tensor``
    (in place, like ``dist.all_reduce``) and the row says whether every rank then
    holds the sum (floats to rounding, integers exactly) and whether the bytes the
    ranks returned are a ring's (:func:`is_ring_traffic`). Every rank returns the
    same rows."""
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
        every = sent_by_every_rank(sent)
        ring_bytes = is_ring_traffic(every, tensor.numel(), tensor.element_size())
        verdict = torch.tensor([int(same)], device=_device())
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)  # 1 only if 1 on every rank
        rows.append(
            {
                "case": f"{tuple(shape)} {str(dtype).removeprefix('torch.')}",
                "sum": bool(verdict[0]),
                "ring bytes": ring_bytes,
            }
        )
    return rows


def transposed_all_reduce_rank(rank: int, world_size: int) -> dict:
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


def bytes_sent_rank(rank: int, world_size: int, numel: int) -> dict:
    """Bytes this rank sends in naive and ring all-reduce of ``numel`` float32 (07)."""
    tensor = torch.ones(numel)
    return {
        "rank": rank,
        "naive": naive_all_reduce(tensor.clone()),
        "ring": ring_all_reduce(tensor.clone()),
    }


def time_all_reduces_rank(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    repeats: int = 5,
    names: Sequence[str] = tuple(ALL_REDUCES),
) -> list[dict]:
    """Seconds (of the slowest rank) of each named all-reduce for float32 tensors
    of the given sizes, the fastest of ``repeats``; rows with bytes sent and bus
    bandwidth (07, 12, bench/allreduce.py).

    The methods take turns within each repeat, so a burst of load on the machine
    hits all of them alike; repeat 0 only warms up connections and buffers. The
    fastest repeat is the one the rest of the machine disturbed least: with other
    work on the cores, the medians of 12's sizes once fitted a negative latency.
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
            fastest = min(seconds[name])
            rows.append(
                {
                    "algorithm": name,
                    "world_size": world_size,
                    "bytes": nbytes,
                    "bytes sent": sent[name],  # by this rank
                    "seconds": fastest,
                    "busbw GB/s": bus_bandwidth(nbytes, fastest, world_size) / 1e9,
                }
            )
    return rows
