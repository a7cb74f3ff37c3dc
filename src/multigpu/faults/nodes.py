"""Several nodes on one machine: one torchrun per "node", joined by a c10d
rendezvous (11)."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import torch.distributed as dist

from multigpu.core.checks import check_number, check_positive_int
from multigpu.faults.restarts import RELIABLE_RESTARTS
from multigpu.runtime.launch import (
    HOST,
    RESTARTS_DEADLINE_S,
    TorchrunError,
    deadline_not_timeout,
    start_torchrun,
    stop_torchrun,
)

NODES_MODULE = "multigpu.ddp"  # the script each node runs unless told another


def rank_table_lines(outputs: Sequence[str]) -> list[str]:
    """The table ``--show-ranks`` prints, header first, from whichever node's
    output holds it (the node of rank 0) (11)."""
    for output in outputs:
        lines = output.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("RANK | LOCAL_RANK"):
                table = [line]
                for row in lines[i + 1 :]:
                    if not row[:1].isdigit():
                        break
                    table.append(row)
                return table
    raise ValueError("No rank table in these outputs. Pass --show-ranks to the script.")


def node_options(nnodes: int, node_rank: int, port: int, run_id: str) -> list[str]:
    """The rendezvous options of node ``node_rank`` of ``nnodes`` on this machine,
    with the store at 127.0.0.1:``port`` (11). On real hosts the endpoint is the
    first host's address and ``is_host`` is left out."""
    return [
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={HOST}:{port}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=is_host=false",  # the store is this process's, see run_nodes
    ]


@deadline_not_timeout
def run_nodes(
    *script_args: Any,
    nnodes: int = 2,
    nproc_per_node: int = 2,
    module: str = NODES_MODULE,
    deadline: float = RESTARTS_DEADLINE_S,
) -> list[str]:
    """Start ``nnodes`` torchruns at once, each a "node" of ``nproc_per_node``
    workers of ``python -m module script_args...``, joined into one world of
    ``nnodes × nproc_per_node`` ranks; return each node's output (stdout and
    stderr together), by node (11).

    The c10d rendezvous needs a store every node can reach. Between hosts the first
    node hosts it on a port fixed in advance; here this process hosts it on a port
    the operating system picks (so runs at the same time never clash), and the
    nodes connect to it as clients (``is_host=false``).
    """
    check_positive_int("nnodes", nnodes)
    check_positive_int("nproc_per_node", nproc_per_node)
    how = f"Pass the seconds to wait, e.g. {RESTARTS_DEADLINE_S:g}."
    check_number("deadline", deadline, how)
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    run_id = uuid.uuid4().hex[:12]
    end = time.monotonic() + deadline
    with ExitStack() as stack:
        logs, processes = [], []
        for node_rank in range(nnodes):
            log = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
            process = start_torchrun(
                module,
                nproc_per_node,
                *script_args,
                rendezvous=node_options(nnodes, node_rank, store.port, run_id),
                env=RELIABLE_RESTARTS,  # workers' own store: see RELIABLE_RESTARTS
                output=log,
            )
            stack.callback(stop_torchrun, process)
            logs.append(log)
            processes.append(process)
        while any(p.poll() is None for p in processes):
            if time.monotonic() > end:
                for process in processes:
                    stop_torchrun(process)
                raise TorchrunError(
                    f"{nnodes} nodes did not finish within {deadline} s and were "
                    "stopped.",
                    _read_all(logs),
                )
            time.sleep(0.05)
        outputs = [_read(log) for log in logs]
        failed = [i for i, p in enumerate(processes) if p.returncode != 0]
        if failed:
            raise TorchrunError(
                f"node(s) {failed} exited with an error; their output ends with:\n"
                + "\n".join(outputs[failed[0]].strip().splitlines()[-15:]),
                "\n".join(outputs),
            )
    del store
    return outputs


def _read(log: Any) -> str:
    log.seek(0)
    return log.read()


def _read_all(logs: Sequence[Any]) -> str:
    return "\n".join(_read(log) for log in logs)
