"""Each rank's stderr, as the parent of spawn sees it."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

_STDERR_TAIL_BYTES = 16_384  # how much of each rank's stderr the parent keeps


class StderrTails:
    """Each rank's stderr: passed on to this process's stderr as it arrives, and its
    last bytes kept for the error messages."""

    def __init__(self) -> None:
        self.forward = True  # pass what arrives on to this process's stderr
        self._open: dict[int, Connection] = {}
        self._tails: dict[int, bytearray] = {}
        self._received: dict[int, int] = {}  # bytes received in all, per rank

    def add(self, rank: int, reader: Connection) -> None:
        os.set_blocking(reader.fileno(), False)
        self._open[rank] = reader
        self._tails[rank] = bytearray()
        self._received[rank] = 0

    def waitables(self) -> list[Connection]:
        return list(self._open.values())

    def pump(self) -> int:
        """Read what the ranks have written so far; return the number of bytes."""
        count = 0
        for rank, reader in list(self._open.items()):
            for _ in range(16):  # a rank that never stops writing cannot stall us
                try:
                    data = os.read(reader.fileno(), 65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # the rank, and all it started, closed their stderr
                    reader.close()
                    del self._open[rank]
                    break
                count += len(data)
                self._received[rank] += len(data)
                tail = self._tails[rank]
                tail += data
                del tail[:-_STDERR_TAIL_BYTES]
                if self.forward:
                    _write_to_stderr(data)
        return count

    def received(self, rank: int) -> int:
        return self._received.get(rank, 0)

    def text(self, rank: int, since: int = 0) -> str:
        """What the rank wrote after its first ``since`` bytes, as far as kept."""
        new = self.received(rank) - since
        if new <= 0:
            return ""
        return bytes(self._tails[rank][-new:]).decode("utf-8", "replace")

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()
        self._open.clear()


def _write_to_stderr(data: bytes) -> None:
    """Write ``data`` to file descriptor 2, where the ranks' stderr went before."""
    try:
        while data:
            data = data[os.write(2, data) :]
    except OSError:
        pass
