"""All-reduce from point-to-point messages: naive and ring (07).

Taught in ``notebooks/07_collectives_from_scratch.ipynb``; ``allreduce_sgd`` (08) uses
the all-reduce functions to average gradients, and ``bench/allreduce.py`` times them.

Every all-reduce here works like ``dist.all_reduce(tensor)`` with the sum: in place,
on every rank of the default process group, for any shape, size and dtype, using
only ``send``/``recv``/``isend``/``irecv``; each returns the bytes this rank sent, to
be put next to the formulas of :mod:`multigpu.costmodel`.

- :func:`naive_all_reduce`: everything to rank 0, the sum back from it.
- :func:`ring_all_reduce`: reduce-scatter, then all-gather, around a ring of n ranks.
- :func:`ring_all_reduce_pipelined`: the same sums, bit for bit, tuned for speed.
- :func:`reduce_scatter` and :func:`all_gather`: the ring's two halves, used on their
  own by sharded training (13, :mod:`multigpu.zero`); like
  ``dist.reduce_scatter_single``/``dist.all_gather_single`` (torch 2.14's names for
  ``reduce_scatter_tensor``/``all_gather_into_tensor``), but they accept chunks of
  unequal sizes, cut as ``tensor.tensor_split(world_size)`` cuts
  (:func:`ring_chunk_sizes`), so no buffer needs padding.

PyTorch's functions are in
https://github.com/pytorch/pytorch/blob/main/torch/distributed/distributed_c10d.py.
The rank functions that run these are in :mod:`multigpu.ranks.collectives`; the
figure of the ring is :func:`multigpu.plots.plot_ring`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

ChunkRule = Callable[[int, int, int], int]  # (rank, step, world_size) -> chunk index
PIECE_BYTES = 2**20  # the pipelined ring adds a received chunk 1 MiB at a time


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


def ring_chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Elements per chunk of the ring, as ``tensor.tensor_split(world_size)`` cuts:
    the first ``numel % world_size`` chunks get one more, e.g. 10 over 4 is
    [3, 3, 2, 2]; chunks may be empty (07)."""
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


# ----------------------------------------------------------------------------------
# The all-reduce functions (run inside a process group, e.g. from launch.spawn)


def send_and_receive(
    outgoing: torch.Tensor, dst: int, incoming: torch.Tensor, src: int
) -> int:
    """Send ``outgoing`` to rank ``dst`` while receiving ``incoming`` from rank
    ``src``; return the bytes sent (07).

    In a ring every rank sends and receives at the same time. With a blocking
    ``send`` each rank could wait for a neighbour that is itself still sending, so
    the ``isend`` and the ``irecv`` are both posted before waiting for either
    (``batch_isend_irecv`` posts them together, as NCCL requires). Empty tensors
    are skipped: both sides know the sizes.
    """
    operations = []
    if outgoing.numel():
        operations.append(dist.P2POp(dist.isend, outgoing, dst))
    if incoming.numel():
        operations.append(dist.P2POp(dist.irecv, incoming, src))
    if operations:
        for request in dist.batch_isend_irecv(operations):
            request.wait()
    return outgoing.numel() * outgoing.element_size()


def naive_all_reduce(tensor: torch.Tensor) -> int:
    """Sum ``tensor`` (any shape) over all ranks in place via rank 0; return the bytes
    this rank sent: (n-1)·S on rank 0, S elsewhere (07)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1 or tensor.numel() == 0:
        return 0
    flat = tensor.contiguous().view(-1)  # (numel,): a copy if not contiguous
    nbytes = flat.numel() * flat.element_size()
    if rank == 0:
        incoming = _scratch_buffer(flat)  # (numel,), kept between calls
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


def ring_all_reduce(tensor: torch.Tensor) -> int:
    """Sum ``tensor`` (any shape) over all ranks in place with a ring: reduce-scatter,
    then all-gather; return the bytes this rank sent, about 2(n-1)/n·S (07)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1 or tensor.numel() == 0:
        return 0
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    flat = tensor.contiguous().view(-1)  # (numel,): a copy if not contiguous
    chunks = flat.tensor_split(world_size)  # n views of (numel/n,): work in place
    buffer = torch.empty_like(chunks[0])  # (numel/n,): chunk 0 is the largest
    sent = 0
    # Reduce-scatter: add the chunk arriving from the left to our copy of it, which
    # we send on at the next step. After n-1 steps chunk rank+1 holds the full sum.
    for step in range(world_size - 1):
        outgoing = chunks[reduce_scatter_send_chunk(rank, step, world_size)]
        ours = chunks[reduce_scatter_send_chunk(left, step, world_size)]
        received = buffer[: ours.numel()]
        sent += send_and_receive(outgoing, right, received, left)
        ours.add_(received)  # our part of the sum joins theirs
    # All-gather: each finished chunk travels once around the ring, overwriting.
    for step in range(world_size - 1):
        outgoing = chunks[all_gather_send_chunk(rank, step, world_size)]
        ours = chunks[all_gather_send_chunk(left, step, world_size)]
        sent += send_and_receive(outgoing, right, ours, left)  # straight in place
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return sent


def ring_all_reduce_pipelined(tensor: torch.Tensor) -> int:
    """:func:`ring_all_reduce`, tuned: the same messages and the same sums, bit for
    bit, but the reduce-scatter is pipelined (:func:`pipelined_reduce_scatter`) and
    the receive buffer is kept between calls (07, bench/allreduce.py)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1 or tensor.numel() == 0:
        return 0
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    flat = tensor.contiguous().view(-1)
    chunks = flat.tensor_split(world_size)
    sent = pipelined_reduce_scatter(chunks, rank, world_size)
    for step in range(world_size - 1):  # all-gather, as in ring_all_reduce
        outgoing = chunks[all_gather_send_chunk(rank, step, world_size)]
        ours = chunks[all_gather_send_chunk(left, step, world_size)]
        sent += send_and_receive(outgoing, right, ours, left)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return sent


def pipelined_reduce_scatter(
    chunks: Sequence[torch.Tensor], rank: int, world_size: int
) -> int:
    """The ring's reduce-scatter with each chunk cut into pieces of PIECE_BYTES: all
    pieces are posted at once and each is added as soon as it has arrived, while
    the next ones are still on the way. ``chunks`` are views of one flat tensor;
    returns the bytes sent (07)."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    buffer = _scratch_buffer(chunks[0])  # (numel/n,), kept between calls
    sent = 0
    for step in range(world_size - 1):
        outgoing = chunks[reduce_scatter_send_chunk(rank, step, world_size)]
        ours = chunks[reduce_scatter_send_chunk(left, step, world_size)]
        received = buffer[: ours.numel()]
        send_requests, receive_requests = _start(
            _pieces(outgoing), right, _pieces(received), left
        )
        # One request per piece; an empty chunk has none, and nothing to add.
        for our_piece, received_piece, request in zip(
            _pieces(ours), _pieces(received), receive_requests
        ):
            request.wait()
            our_piece.add_(received_piece)  # the same additions as ring_all_reduce
        for request in send_requests:
            request.wait()
        sent += outgoing.numel() * outgoing.element_size()
    return sent


def library_all_reduce(tensor: torch.Tensor) -> None:
    """``dist.all_reduce`` (sum) with the same call shape; traffic is not counted."""
    dist.all_reduce(tensor)


ALL_REDUCES: dict[str, Callable[[torch.Tensor], int | None]] = {
    "naive": naive_all_reduce,
    "ring": ring_all_reduce,
    "ring pipelined": ring_all_reduce_pipelined,
    "dist.all_reduce": library_all_reduce,
}


# ----------------------------------------------------------------------------------
# The ring's two halves on their own: reduce-scatter and all-gather (13)


def _check_chunk(output_or_input: str, chunk: torch.Tensor, full: torch.Tensor) -> None:
    """Raise unless ``chunk`` has this rank's size of a ``full`` cut into chunks."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    expected = ring_chunk_sizes(full.numel(), world_size)[rank]
    if chunk.numel() != expected or chunk.dtype != full.dtype:
        raise ValueError(
            f"The {output_or_input} of rank {rank} has {chunk.numel()} elements of "
            f"{chunk.dtype}, but its chunk of {full.numel()} elements of "
            f"{full.dtype} over {world_size} ranks has {expected} of {full.dtype}. "
            "Pass a chunk of the size ring_chunk_sizes(numel, world_size)[rank] "
            "and of the full tensor's dtype."
        )


def reduce_scatter(output: torch.Tensor, input: torch.Tensor) -> int:
    """Sum ``input`` (any shape, S bytes) over the ranks and keep only this rank's
    chunk of the sum in ``output`` (chunk ``rank`` of ``input.tensor_split(n)``);
    return the bytes sent, about (n-1)/n·S (13).

    The first half of :func:`ring_all_reduce`, with the schedule shifted by one so
    that rank r ends with chunk r (the ring all-reduce leaves chunk r+1 on rank r).
    ``input`` is not changed.
    """
    world_size, rank = dist.get_world_size(), dist.get_rank()
    _check_chunk("output", output, input)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = input.contiguous().view(-1).clone().tensor_split(world_size)  # ours
    buffer = torch.empty_like(chunks[0])  # (numel/n,): chunk 0 is the largest
    sent = 0
    for step in range(world_size - 1):
        # Send the partial sum of chunk rank-1-step to the right, add the one of
        # chunk rank-2-step from the left; after n-1 steps chunk `rank` is complete.
        outgoing = chunks[(rank - 1 - step) % world_size]
        ours = chunks[(rank - 2 - step) % world_size]
        received = buffer[: ours.numel()]
        sent += send_and_receive(outgoing, right, received, left)
        ours.add_(received)
    output.copy_(chunks[rank].view_as(output))
    return sent


def all_gather(output: torch.Tensor, input: torch.Tensor) -> int:
    """Collect every rank's ``input`` into ``output``, in rank order: chunk r of
    ``output.tensor_split(n)`` comes from rank r; return the bytes sent, about
    (n-1)/n·S for an ``output`` of S bytes (13).

    The second half of :func:`ring_all_reduce`: each chunk travels once around the
    ring. ``input`` may be a view of this rank's chunk of ``output`` itself.
    """
    world_size, rank = dist.get_world_size(), dist.get_rank()
    _check_chunk("input", input, output)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    flat = output.contiguous().view(-1)  # (numel,): a copy if not contiguous
    chunks = flat.tensor_split(world_size)
    chunks[rank].copy_(input.reshape(-1))
    sent = 0
    for step in range(world_size - 1):
        # Pass on the chunk that arrived last (our own first), receive the next.
        outgoing = chunks[(rank - step) % world_size]
        incoming = chunks[(rank - 1 - step) % world_size]
        sent += send_and_receive(outgoing, right, incoming, left)
    if flat.data_ptr() != output.data_ptr():
        output.copy_(flat.view_as(output))
    return sent


# ----------------------------------------------------------------------------------
# Helpers of the tuned versions


_scratch: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _scratch_buffer(like: torch.Tensor) -> torch.Tensor:
    """A receive buffer shaped like ``like``, kept between calls: allocating (and
    first touching) tens of MB on every call costs more than the adds."""
    key = (like.dtype, like.device)
    if key not in _scratch or _scratch[key].numel() < like.numel():
        _scratch[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return _scratch[key][: like.numel()]


def _pieces(chunk: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``chunk`` cut into pieces of about PIECE_BYTES. Sender and receiver cut the
    same chunk, so their pieces match one to one."""
    count = -(-chunk.numel() * chunk.element_size() // PIECE_BYTES)  # ceil
    return chunk.tensor_split(max(1, count))


class _Done:
    """A request that has already completed."""

    def wait(self) -> bool:
        return True


def _start(
    sends: Sequence[torch.Tensor], dst: int, receives: Sequence[torch.Tensor], src: int
) -> tuple[list, list]:
    """Post every send (to ``dst``) and receive (from ``src``) before waiting for any;
    return the send and the receive requests. Empty tensors are skipped."""
    sends = [t for t in sends if t.numel()]
    receives = [t for t in receives if t.numel()]
    operations = [dist.P2POp(dist.isend, t, dst) for t in sends]
    operations += [dist.P2POp(dist.irecv, t, src) for t in receives]
    if not operations:
        return [], []
    requests = dist.batch_isend_irecv(operations)
    if len(requests) != len(operations):  # NCCL: one request for the whole batch
        for request in requests:
            request.wait()
        requests = [_Done()] * len(operations)
    return requests[: len(sends)], requests[len(sends) :]


# ----------------------------------------------------------------------------------
# The ring in one process: for the exercises


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
