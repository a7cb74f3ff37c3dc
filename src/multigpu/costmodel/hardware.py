"""Links and machines as plain data: bandwidth and latency per link (12).

Links are plain data (:data:`LINKS`): bandwidth per direction, as a ring uses it,
and a per-message latency. Bandwidths are the published peaks; real collectives
reach less (nccl-tests' busbw is typically 70-90 % of them), and the latencies are
orders of magnitude, not specifications. Sources:

- PCIe: 8 / 16 / 32 GT/s per lane for 3.0 / 4.0 / 5.0 with 128b/130b encoding, so
  about 15.8 / 31.5 / 63 GB/s per direction for x16 (PCI-SIG quotes 128 GB/s for
  5.0 x16, both directions together).
- NVLink: each V100 has 6 NVLink 2 links of 25 GB/s per direction (150 GB/s per
  direction, 300 GB/s in all, as the DGX-1 topology printed by ``nvidia-smi topo
  -m`` shows); A100: 12 NVLink 3 links, 600 GB/s in all; H100: 18 NVLink 4 links,
  900 GB/s in all (NVIDIA's NVLink pages, https://www.nvidia.com/en-us/data-center/nvlink/).
  TITAN RTX: 2 links, 100 GB/s in all as listed for the same TU102 chip's Quadro
  RTX 6000/8000 (taken here as 50 GB/s per direction).
- InfiniBand EDR: 4 lanes of 25.78 Gb/s, 100 Gb/s, 12.5 GB/s per direction (NCCL's
  maintainers quote 12.2 GB/s reached, and 48 GB/s on a DGX-1 with 4 adapters:
  https://github.com/NVIDIA/nccl-tests/issues/29); HDR 200 Gb/s; Ethernet likewise.
- Latency per message: NVIDIA publishes none for collectives. Users' nccl-tests
  runs in NVIDIA/nccl's GitHub issues show 8-32 byte all-reduces of about 10 µs on
  2 NVLinked A100s and 20 µs across two InfiniBand nodes, so α of 5 µs (NVLink,
  PCIe) and 10 µs (InfiniBand) per message; TCP Ethernet 25 µs.
"""

from __future__ import annotations

from dataclasses import dataclass

from multigpu.core.sizes import GB


@dataclass(frozen=True)
class Link:
    """A connection between devices: peak ``bandwidth`` per direction (bytes/s)
    and ``latency`` per message (s); sources in the module docstring (12)."""

    name: str
    bandwidth: float
    latency: float


LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("PCIe 3.0 x16", 15.75 * GB, 5e-6),
        Link("PCIe 4.0 x16", 31.5 * GB, 5e-6),
        Link("PCIe 5.0 x16", 63.0 * GB, 5e-6),
        Link("NVLink bridge (TITAN RTX)", 50.0 * GB, 5e-6),
        Link("NVLink 2 (V100)", 150.0 * GB, 5e-6),
        Link("NVLink 3 (A100)", 300.0 * GB, 5e-6),
        Link("NVLink 4 (H100)", 450.0 * GB, 5e-6),
        Link("InfiniBand EDR 100 Gb/s", 12.5 * GB, 10e-6),
        Link("4 x InfiniBand EDR (DGX-1)", 50.0 * GB, 10e-6),
        Link("InfiniBand HDR 200 Gb/s", 25.0 * GB, 10e-6),
        Link("Ethernet 10 Gb/s", 1.25 * GB, 25e-6),
        Link("Ethernet 100 Gb/s", 12.5 * GB, 25e-6),
    )
}


@dataclass(frozen=True)
class Machine:
    """Nodes of ``devices_per_node`` devices joined inside a node by ``intra`` and
    between nodes by ``inter``: a ring over several nodes runs at the pace of its
    slowest link (12)."""

    name: str
    devices_per_node: int
    intra: Link
    inter: Link | None = None

    def link(self, world_size: int) -> Link:
        """The link that bounds a ring over ``world_size`` devices (12)."""
        if world_size <= self.devices_per_node:
            return self.intra
        if self.inter is None:
            raise ValueError(
                f"{self.name} has {self.devices_per_node} devices and no link between "
                f"nodes, so it cannot run {world_size}. Give the Machine an `inter` "
                "link (for example LINKS['InfiniBand EDR 100 Gb/s'])."
            )
        slow = min((self.intra, self.inter), key=lambda link: link.bandwidth)
        latency = max(self.intra.latency, self.inter.latency)
        return Link(f"{slow.name} (between nodes)", slow.bandwidth, latency)
