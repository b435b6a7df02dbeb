"""Several probes as one: the GPUs of the first, then the host device (``--gpus auto,host``).

Devices are numbered in order across the probes (the first probe's 0..n-1, the next one's
from n on); each reading and process keeps the source it came from (``GpuReading.source``),
so a host device beside a simulated GPU is never called simulated.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.gpu.model import GpuReading, Probe, ProcessReading, own, track


class CombinedProbe:
    """``probes`` side by side; ``offsets`` says where each one's devices start."""

    def __init__(self, probes: list[Probe]) -> None:
        if not probes:
            raise ValueError("CombinedProbe needs at least one probe")
        self.probes = probes
        self.source = "+".join(p.source for p in probes)
        self.simulated = all(p.simulated for p in probes)
        self.driver_version = next((p.driver_version for p in probes if p.driver_version),
                                   None)
        self.offsets: list[int] = []
        at = 0
        for p in probes:
            self.offsets.append(at)
            at += len(p.devices())

    def part(self, cls: type) -> object | None:
        """The first probe of type ``cls`` (the host probe, for its host figures)."""
        return next((p for p in self.probes if isinstance(p, cls)), None)

    def track(self, pid: int) -> None:
        """Tell the probes that follow processes (the host's) of a new worker."""
        for p in self.probes:
            track(p, pid)

    def own(self, pid: int) -> None:
        """Tell the probes that follow processes (the host's) of a process of the engine."""
        for p in self.probes:
            own(p, pid)

    @property
    def estimated(self) -> frozenset[int]:
        """The processes a probe counts at their RSS (the host's: PSS unreadable)."""
        return frozenset().union(*(getattr(p, "estimated", frozenset()) for p in self.probes))

    @property
    def orphans(self) -> frozenset[int]:
        """Processes of ours a probe follows after their parent exited (the host's)."""
        return frozenset().union(*(getattr(p, "orphans", frozenset()) for p in self.probes))

    def devices(self) -> list[GpuReading]:
        out: list[GpuReading] = []
        for offset, p in zip(self.offsets, self.probes, strict=True):
            out.extend(replace(r, index=r.index + offset, source=r.source or p.source)
                       for r in p.devices())
        return out

    def processes(self) -> list[ProcessReading]:
        out: list[ProcessReading] = []
        for offset, p in zip(self.offsets, self.probes, strict=True):
            out.extend(replace(r, gpu_index=r.gpu_index + offset) for r in p.processes())
        return out

    def close(self) -> None:
        for p in self.probes:
            p.close()
