"""torchrun on a fixed port, and the EADDRINUSE it meets (09b)."""

from __future__ import annotations

from multigpu.runtime.launch import (
    TORCHRUN_DEADLINE_S,
    TorchrunError,
    deadline_not_timeout,
    run_torchrun,
)


@deadline_not_timeout
def torchrun_on_port(
    port: int,
    nproc_per_node: int = 2,
    module: str = "multigpu.ranks.torchrun_example",
    deadline: float = TORCHRUN_DEADLINE_S,
) -> str:
    """Run ``torchrun --nproc-per-node=N --master-port=PORT -m module``, the way the
    common walk-throughs launch (a fixed port, no ``--standalone``), and return what
    it printed, stdout and stderr. When another program holds ``port`` it fails
    with ``EADDRINUSE``; the run is stopped after ``deadline`` seconds (09b).
    ``launch.run_torchrun`` uses ``--standalone``, a free port, unless told a port."""
    try:
        result = run_torchrun(
            module, nproc_per_node, deadline=deadline, check=False, master_port=port
        )
    except TorchrunError:
        return f"(stopped after {deadline} s)"
    return result.stdout + result.stderr


def eaddrinuse_lines(output: str) -> list[str]:
    """The lines of torchrun's output that name the clash, port numbers replaced by
    ``PORT`` so that they read the same on every run (09b)."""
    import re

    lines = [line.strip() for line in output.splitlines()]
    found = [line for line in lines if "EADDRINUSE" in line]
    return [re.sub(r"port: \d+", "port: PORT", line) for line in dict.fromkeys(found)]
