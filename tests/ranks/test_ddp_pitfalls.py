"""Tests for multigpu.ranks.ddp_pitfalls: what notebook 09 starts with mp.spawn and
the ranks that meet in DDP's constructor (the evaluation probe is tested with its
checker in tests/exercises/test_ddp_evaluation.py)."""

import socket
import tempfile

import pytest
import torch.multiprocessing as mp

from multigpu.ranks import ddp_pitfalls
from multigpu.runtime.launch import spawn


def test_free_ports_are_distinct_ports():
    ports = ddp_pitfalls.free_ports(3)
    assert len(set(ports)) == 3 and all(0 < port < 2**16 for port in ports)


def test_free_ports_lie_below_the_ports_outgoing_connections_get():
    low = ddp_pitfalls.ephemeral_start()
    if low is None:
        pytest.skip("no Linux ephemeral port range to stay below on this machine")
    ports = ddp_pitfalls.free_ports(4)
    assert all(ddp_pitfalls.FIRST_FREE_PORT <= port < low for port in ports), ports


def test_a_port_taken_meanwhile_is_replaced_by_a_free_one(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        monkeypatch.setattr(ddp_pitfalls, "ephemeral_start", lambda: busy + 1)
        monkeypatch.setattr(ddp_pitfalls, "FIRST_FREE_PORT", busy)
        ports = ddp_pitfalls.free_ports(1)  # the only draw is the busy port
    assert ports != [busy] and len(ports) == 1


def test_env_and_tcp_init_methods_give_the_same_sums_under_mp_spawn():
    env_port, tcp_port = ddp_pitfalls.free_ports(2)
    with tempfile.TemporaryDirectory() as folder:
        returned = mp.spawn(
            ddp_pitfalls.init_methods_rank,
            args=(3, env_port, tcp_port, folder),
            nprocs=3,
        )
        sums = ddp_pitfalls.read_rank_files(folder, 3)
    assert returned is None  # mp.spawn gives no results back
    assert sums == [{"env://": 6.0, "tcp://": 6.0}] * 3


def test_ddp_construction_waits_for_a_late_rank():
    waited = spawn(ddp_pitfalls.ddp_construction_waits_rank, 2, 1, 1.0)
    assert waited[0] > 0.5 and waited[1] < 0.5
