"""Ring all-reduces that learners write in notebook 07's exercise, each with one
mistake; the ranks import them by name (tests/exercises/test_collectives.py)."""

import torch
import torch.distributed as dist

from multigpu.collectives import send_and_receive


def _ring(tensor, reduce_scatter=True, all_gather=True, unit="bytes"):
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    buffer = torch.empty_like(chunks[0])
    sent = 0
    for step in range(n - 1):
        outgoing = chunks[(rank - step) % n]
        ours = chunks[(rank - 1 - step) % n]
        incoming = buffer[: ours.numel()]
        nbytes = send_and_receive(outgoing, right, incoming, left)
        sent += nbytes if unit == "bytes" else outgoing.numel()
        if reduce_scatter:
            ours += incoming
    if all_gather:
        for step in range(n - 1):
            outgoing = chunks[(rank + 1 - step) % n]
            ours = chunks[(rank - step) % n]
            nbytes = send_and_receive(outgoing, right, ours, left)
            sent += nbytes if unit == "bytes" else outgoing.numel()
    return sent


def as_shipped(tensor):
    """The exercise's TODOs left as they are: nothing sent, nothing added."""
    return 0


def no_all_gather(tensor):
    return _ring(tensor, all_gather=False)


def counts_elements(tensor):
    return _ring(tensor, unit="elements")


def forgets_bytes(tensor):
    _ring(tensor)
    return 0


def reduce_to_rank_0(tensor):
    """Every rank sends its tensor to rank 0, which adds them; no broadcast back."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for source in range(1, n):
            dist.recv(incoming, src=source)
            tensor += incoming
        return 0
    dist.send(tensor, dst=0)
    return tensor.numel() * tensor.element_size()


def copies_instead_of_adding(tensor):
    """The reduce-scatter overwrites its chunk with the one that arrives."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    sent = 0
    for step in range(n - 1):
        outgoing = chunks[(rank - step) % n]
        ours = chunks[(rank - 1 - step) % n]
        sent += send_and_receive(outgoing, right, ours, left)
    for step in range(n - 1):
        outgoing = chunks[(rank + 1 - step) % n]
        ours = chunks[(rank - step) % n]
        sent += send_and_receive(outgoing, right, ours, left)
    return sent


def blocking_send_then_receive(tensor):
    """Every rank sends with a blocking send, then receives: each waits in its send
    for a neighbour that is itself waiting in its own send."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    buffer = torch.empty_like(chunks[0])
    sent = 0
    for step in range(n - 1):
        outgoing = chunks[(rank - step) % n]
        ours = chunks[(rank - 1 - step) % n]
        incoming = buffer[: ours.numel()]
        dist.send(outgoing, right)
        dist.recv(incoming, left)
        sent += outgoing.numel() * outgoing.element_size()
        ours += incoming
    for step in range(n - 1):
        outgoing = chunks[(rank + 1 - step) % n]
        dist.send(outgoing, right)
        dist.recv(chunks[(rank - step) % n], left)
        sent += outgoing.numel() * outgoing.element_size()
    return sent


# ----------------------------------------------------------------------------------
# Correct rings written another way: the checker must accept them.


def finishes_its_own_chunk(tensor):
    """A correct ring in which rank r completes chunk r (13's reduce-scatter, then
    all-gather), not chunk r + 1 as the package's ring does."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    buffer = torch.empty_like(chunks[0])
    sent = 0
    for step in range(n - 1):
        outgoing = chunks[(rank - 1 - step) % n]
        ours = chunks[(rank - 2 - step) % n]
        incoming = buffer[: ours.numel()]
        sent += send_and_receive(outgoing, right, incoming, left)
        ours += incoming
    for step in range(n - 1):
        outgoing = chunks[(rank - step) % n]
        sent += send_and_receive(outgoing, right, chunks[(rank - 1 - step) % n], left)
    return sent


def counts_received_bytes(tensor):
    """A correct ring that counts the bytes it received: around a ring the ranks
    together receive what they send."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.view(-1).tensor_split(n)
    buffer = torch.empty_like(chunks[0])
    received = 0
    for step in range(n - 1):
        ours = chunks[(rank - 1 - step) % n]
        incoming = buffer[: ours.numel()]
        send_and_receive(chunks[(rank - step) % n], right, incoming, left)
        received += incoming.numel() * incoming.element_size()
        ours += incoming
    for step in range(n - 1):
        ours = chunks[(rank - step) % n]
        send_and_receive(chunks[(rank + 1 - step) % n], right, ours, left)
        received += ours.numel() * ours.element_size()
    return received
