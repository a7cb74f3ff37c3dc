"""torchrun on a port another program holds fails with EADDRINUSE."""

import socket

from multigpu import ddp


def test_port_in_use_gives_eaddrinuse():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        output = ddp.torchrun_on_port(held.getsockname()[1], deadline=60)
    lines = ddp.eaddrinuse_lines(output)
    assert len(lines) == 1 and "port: PORT" in lines[0], output
    assert lines[0].startswith("torch.distributed.DistNetworkError: ")
