"""All-reduce from point-to-point messages: naive and ring, with their cost.

Taught in ``notebooks/07_collectives_from_scratch.ipynb``; ``allreduce_sgd`` (08) uses
the all-reduce functions to average gradients, and ``bench/allreduce.py`` times them.

Both all-reduce functions work like ``dist.all_reduce(tensor)`` with the sum: in
place, on every rank of the default process group, for any shape, size and dtype,
using only ``send``/``recv``/``isend``/``irecv``. They return the number of bytes
this rank sent, so measured traffic can be put next to the formulas below.

- naive: every rank sends its tensor to rank 0, rank 0 adds them up and sends the
  sum back. Rank 0 sends (n-1)·S bytes, every other rank S.
- ring: the tensor is cut into n chunks. Reduce-scatter: in n-1 steps each rank
  sends one chunk to its right neighbour and adds the chunk arriving from its left,
  so that rank r ends up owning the full sum of chunk (r+1) mod n. All-gather: in
  n-1 more steps the finished chunks travel once around the ring. Every rank sends
  2(n-1)/n·S bytes, whatever n is.

Cost (α-β model, α = latency per message, B = bandwidth of one link):
ring ≈ 2(n-1)·α + 2(n-1)/n · S/B; naive ≈ 2(n-1)·(α + S/B), because rank 0's link
carries everything. Bus bandwidth as nccl-tests define it: algbw = S/t,
busbw = algbw · 2(n-1)/n, the number to compare with a link's bandwidth.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

ChunkRule = Callable[[int, int, int], int]  # (rank, step, world_size) -> chunk index
PIECE_BYTES = 2**20  # the ring adds a received chunk piece by piece, 1 MiB at a time


# ----------------------------------------------------------------------------------
# The ring's schedule: which chunk each rank sends at each step


def reduce_scatter_send_chunk(rank: int, step: int, world_size: int) -> int:
    """Chunk that ``rank`` sends to its right neighbour at reduce-scatter ``step``:
    its own chunk first, then the one it has just added to (07)."""
    return (rank - step) % world_size


def all_gather_send_chunk(rank: int, step: int, world_size: int) -> int:
    """Chunk that ``rank`` sends to its right neighbour at all-gather ``step``: after
    the reduce-scatter, rank r owns chunk r+1 and passes it on first (07)."""
    return (rank + 1 - step) % world_size


def chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Elements per chunk, as ``tensor.tensor_split(world_size)`` cuts: the first
    ``numel % world_size`` chunks get one more; chunks may be empty (07)."""
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


# ----------------------------------------------------------------------------------
# The all-reduce functions (run inside a process group, e.g. from launch.spawn)


def _flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view of ``tensor``, or of a contiguous copy (to copy back at the end)."""
    return tensor.contiguous().view(-1)


class _Done:
    """A request that has already completed."""

    def wait(self) -> bool:
        return True


def _start(
    sends: Sequence[torch.Tensor], dst: int, receives: Sequence[torch.Tensor], src: int
) -> tuple[list, list]:
    """Post every send (to ``dst``) and receive (from ``src``) before waiting for any,
    so a ring of ranks that all send at once cannot deadlock; return the send and the
    receive requests. Empty tensors are skipped (both sides know their sizes)."""
    sends = [t for t in sends if t.numel()]
    receives = [t for t in receives if t.numel()]
    operations = [dist.P2POp(dist.isend, t, dst) for t in sends]
    operations += [dist.P2POp(dist.irecv, t, src) for t in receives]
    if not operations:
        return [], []
    # isend/irecv one by one; batch_isend_irecv also groups them as NCCL needs.
    requests = dist.batch_isend_irecv(operations)
    if len(requests) != len(operations):  # NCCL: one request for the whole batch
        for request in requests:
            request.wait()
        requests = [_Done()] * len(operations)
    return requests[: len(sends)], requests[len(sends) :]


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> int:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``; return the bytes
    sent."""
    send_requests, receive_requests = _start([send], dst, [recv], src)
    for request in send_requests + receive_requests:
        request.wait()
    return send.numel() * send.element_size()


_scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _scratch_buffer(like: torch.Tensor) -> torch.Tensor:
    """A receive buffer shaped like ``like``, kept between calls: allocating (and
    first touching) tens of MB on every call costs more than the adds."""
    key = (like.dtype, like.device)
    if key not in _scratch or _scratch[key].numel() < like.numel():
        _scratch[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return _scratch[key][: like.numel()]


def naive_all_reduce(tensor: torch.Tensor) -> int:
    """Sum ``tensor`` (any shape) over all ranks in place via rank 0; return the bytes
    this rank sent: (n-1)·S on rank 0, S elsewhere (07)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1 or tensor.numel() == 0:
        return 0
    flat = _flat_view(tensor)
    nbytes = flat.numel() * flat.element_size()
    if rank == 0:
        incoming = _scratch_buffer(flat)
        for source in range(1, world_size):  # one after another: rank 0's link is busy
            dist.recv(incoming, src=source)
            flat.add_(incoming)
        requests = [dist.isend(flat, dst=other) for other in range(1, world_size)]
        for request in requests:
            request.wait()
        sent = (world_size - 1) * nbytes
    else:
        dist.send(flat, dst=0)
        dist.recv(flat, src=0)
        sent = nbytes
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return sent


def _pieces(chunk: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``chunk`` cut into pieces of about PIECE_BYTES. Sender and receiver cut the
    same chunk, so their pieces match one to one."""
    count = -(-chunk.numel() * chunk.element_size() // PIECE_BYTES)  # ceil
    return chunk.tensor_split(max(1, count))


def ring_reduce_scatter(chunks: list[torch.Tensor], rank: int, world_size: int) -> int:
    """First half of the ring: afterwards ``chunks[(rank + 1) % n]`` holds the sum
    over all ranks. ``chunks`` are views of one flat tensor; returns bytes sent (07)."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    incoming = _scratch_buffer(chunks[0])  # the first chunk is the largest
    sent = 0
    for step in range(world_size - 1):
        send = chunks[reduce_scatter_send_chunk(rank, step, world_size)]
        target = chunks[reduce_scatter_send_chunk(left, step, world_size)]
        buffer = incoming[: target.numel()]
        # Pipelining: cut the chunk into pieces, post them all, and add each piece
        # as soon as it has arrived, while the next ones are still on the way.
        targets, buffers = _pieces(target), _pieces(buffer)
        send_requests, receive_requests = _start(_pieces(send), right, buffers, left)
        arrived = [(t, b) for t, b in zip(targets, buffers, strict=True) if t.numel()]
        for (target_piece, buffer_piece), request in zip(
            arrived, receive_requests, strict=True
        ):
            request.wait()
            target_piece.add_(buffer_piece)  # our part of the sum joins theirs
        for request in send_requests:
            request.wait()
        sent += send.numel() * send.element_size()
    return sent


def ring_all_gather(chunks: list[torch.Tensor], rank: int, world_size: int) -> int:
    """Second half of the ring: pass the finished chunks around until every rank has
    all of them; returns bytes sent (07, exercise)."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    sent = 0
    for step in range(world_size - 1):
        send = chunks[all_gather_send_chunk(rank, step, world_size)]
        receive = chunks[all_gather_send_chunk(left, step, world_size)]
        sent += _exchange(send, right, receive, left)  # arrives straight in place
    return sent


def ring_all_reduce(tensor: torch.Tensor) -> int:
    """Sum ``tensor`` (any shape) over all ranks in place with a ring (reduce-scatter,
    then all-gather); return the bytes this rank sent, about 2(n-1)/n·S (07)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1 or tensor.numel() == 0:
        return 0
    flat = _flat_view(tensor)
    chunks = list(flat.tensor_split(world_size))  # views: work happens in place
    sent = ring_reduce_scatter(chunks, rank, world_size)
    sent += ring_all_gather(chunks, rank, world_size)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return sent


def library_all_reduce(tensor: torch.Tensor) -> None:
    """``dist.all_reduce`` (sum) with the same call shape; traffic is not counted."""
    dist.all_reduce(tensor)


ALL_REDUCES: dict[str, Callable[[torch.Tensor], int | None]] = {
    "naive": naive_all_reduce,
    "ring": ring_all_reduce,
    "dist.all_reduce": library_all_reduce,
}


# ----------------------------------------------------------------------------------
# Bytes and time: the formulas


def naive_bytes_per_rank(nbytes: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends in :func:`naive_all_reduce` of an ``nbytes`` tensor (07)."""
    if world_size == 1 or nbytes == 0:
        return 0
    return (world_size - 1) * nbytes if rank == 0 else nbytes


def ring_bytes_per_rank(
    numel: int, element_size: int, world_size: int, rank: int
) -> int:
    """Exact bytes ``rank`` sends in :func:`ring_all_reduce`: every chunk twice,
    except chunk r+1 (kept in the reduce-scatter) and r+2 (not sent on) (07)."""
    if world_size == 1:
        return 0
    sizes = chunk_sizes(numel, world_size)
    skipped = sizes[(rank + 1) % world_size] + sizes[(rank + 2) % world_size]
    return (2 * numel - skipped) * element_size


def ring_bytes_theory(nbytes: float, world_size: int) -> float:
    """2(n-1)/n · S: what each rank sends in a ring all-reduce (exact when n
    divides the element count) (07)."""
    return 2 * (world_size - 1) / world_size * nbytes


def alpha_beta_time(
    algorithm: str, nbytes: float, world_size: int, alpha: float, bandwidth: float
) -> float:
    """Seconds the α-β model predicts for "ring" or "naive" all-reduce of ``nbytes``
    with ``alpha`` seconds per message and ``bandwidth`` bytes/s per link (07, 12)."""
    steps = 2 * (world_size - 1)
    if algorithm == "ring":
        return steps * alpha + ring_bytes_theory(nbytes, world_size) / bandwidth
    if algorithm == "naive":
        return steps * (alpha + nbytes / bandwidth)
    raise ValueError(f"Unknown algorithm {algorithm!r}. Use 'ring' or 'naive'.")


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """nccl-tests' algbw: tensor bytes over time, bytes/s (07)."""
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' busbw for all-reduce: algbw · 2(n-1)/n, comparable across world
    sizes and with link bandwidth, bytes/s (07)."""
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


# ----------------------------------------------------------------------------------
# The ring in one process: for the figure and the exercises


def simulate_ring_all_reduce(
    tensors: Sequence[torch.Tensor],
    reduce_scatter_chunk: ChunkRule = reduce_scatter_send_chunk,
    all_gather_chunk: ChunkRule = all_gather_send_chunk,
) -> list[torch.Tensor]:
    """Run the ring schedule on one tensor per rank inside this process and return
    each rank's result; a wrong schedule gives wrong sums (07 exercises)."""
    world_size = len(tensors)
    chunks = [list(t.reshape(-1).clone().tensor_split(world_size)) for t in tensors]
    for phase, rule in (("reduce", reduce_scatter_chunk), ("gather", all_gather_chunk)):
        for step in range(world_size - 1):
            # Every rank sends at once: read all messages before changing anything.
            messages = []
            for rank in range(world_size):
                index = rule(rank, step, world_size)
                messages.append((index, chunks[rank][index].clone()))
            for rank, (index, message) in enumerate(messages):
                receiver = chunks[(rank + 1) % world_size][index]
                if phase == "reduce":
                    receiver.add_(message)
                else:
                    receiver.copy_(message)
    return [torch.cat(c).view_as(t) for c, t in zip(chunks, tensors, strict=True)]


def ring_states(world_size: int) -> list[dict]:
    """For each step of the ring: which ranks' data each (rank, chunk) holds and
    which chunk each rank sends; drives the figure of notebook 07."""
    holds = [[{rank} for _ in range(world_size)] for rank in range(world_size)]
    states = []
    phases = (
        ("reduce-scatter", reduce_scatter_send_chunk),
        ("all-gather", all_gather_send_chunk),
    )
    for phase, rule in phases:
        for step in range(world_size - 1):
            sends = [rule(rank, step, world_size) for rank in range(world_size)]
            states.append(
                {
                    "title": f"{phase} step {step + 1}",
                    "holds": [[set(h) for h in row] for row in holds],
                    "sends": sends,
                }
            )
            messages = [set(holds[rank][sends[rank]]) for rank in range(world_size)]
            for rank, chunk in enumerate(sends):
                receiver = holds[(rank + 1) % world_size]
                if phase == "reduce-scatter":
                    receiver[chunk] |= messages[rank]
                else:
                    receiver[chunk] = messages[rank]
    states.append({"title": "done", "holds": holds, "sends": [None] * world_size})
    return states


def plot_ring(world_size: int = 4):
    """One panel per ring step: rows are ranks, columns chunks; the colour and the
    digits say whose data a chunk holds, a red box marks the chunk sent (07)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    states = ring_states(world_size)
    figure, axes = plt.subplots(
        1, len(states), figsize=(2.2 * len(states), 2.6), squeeze=False
    )
    for axis, state in zip(axes[0], states, strict=True):
        counts = [[len(h) for h in row] for row in state["holds"]]
        axis.imshow(counts, cmap="Blues", vmin=0, vmax=world_size + 1)
        for rank, row in enumerate(state["holds"]):
            for chunk, holders in enumerate(row):
                label = "".join(str(r) for r in sorted(holders))
                colour = "white" if len(holders) == world_size else "black"
                axis.text(
                    chunk,
                    rank,
                    label,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color=colour,
                )
            chunk = state["sends"][rank]
            if chunk is not None:
                corner = (chunk - 0.5, rank - 0.5)
                axis.add_patch(Rectangle(corner, 1, 1, fill=False, lw=2, ec="red"))
        axis.set_title(state["title"], fontsize=9)
        axis.set_xticks(range(world_size))
        axis.set_yticks(range(world_size))
        axis.set_xlabel("chunk")
    axes[0][0].set_ylabel("rank (sends to rank + 1)")
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------------
# Workers for launch.spawn (tests, notebook 07, bench/allreduce.py)


def ping_pong(rank: int, world_size: int, value: float) -> list[float]:
    """Rank 0 sends ``value`` to rank 1, which doubles it and sends it back; every
    rank returns what its tensor held at the end (07)."""
    tensor = torch.tensor([value if rank == 0 else 0.0])
    if rank == 0:
        dist.send(tensor, dst=1)
        dist.recv(tensor, src=1)
    elif rank == 1:
        dist.recv(tensor, src=0)
        tensor *= 2
        dist.send(tensor, dst=0)
    return tensor.tolist()


def rank_tensor(rank: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A deterministic, rank-dependent input for comparisons (values 0..99 + rank)."""
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
    """For each (shape, dtype): results and bytes sent of naive, ring and
    ``dist.all_reduce`` on the same input (tests, 07)."""
    rows = []
    for shape, dtype in cases:
        row = {"shape": tuple(shape), "dtype": dtype}
        for name, all_reduce in ALL_REDUCES.items():
            tensor = rank_tensor(rank, shape, dtype).to(_device())
            row[f"{name} bytes"] = all_reduce(tensor)
            row[name] = tensor.cpu()
        rows.append(row)
    return rows


def transposed_all_reduce(rank: int, world_size: int) -> dict:
    """Naive and ring all-reduce of a non-contiguous (transposed) tensor (tests)."""
    base = rank_tensor(rank, (3, 5), torch.float32)
    expected = base.clone()
    dist.all_reduce(expected)
    row = {"expected": expected.t()}
    for name in ("naive", "ring"):
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
    """Median seconds (of the slowest rank) of each all-reduce for float32 tensors of
    the given sizes; rows with bytes sent and bus bandwidth (07, bench/allreduce.py).

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
