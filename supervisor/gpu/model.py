"""The common shape of what every GPU probe answers: readings and the ``Probe`` protocol.

Memory is in MiB (2**20 bytes) throughout. A field that the source could not read this time
is ``None`` ("not available"); callers must treat it as unknown, never as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One device at one instant.

    ``total_mib`` is always present (cached from the first successful read; 0 only if the
    device never answered). ``used_mib`` may exceed ``total_mib`` on an over-committed
    simulated GPU; ``free_mib`` is never negative.
    """

    index: int
    name: str | None
    total_mib: int
    used_mib: int | None
    free_mib: int | None
    util_pct: int | None
    temp_c: int | None
    power_w: float | None
    source: str | None = None  # where it was read ("nvml", "simulated", "host"); None: the probe's


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process holding memory on one GPU (``used_mib`` None when the driver won't say).

    ``allocated`` is False when the source knows the process holds nothing but its (simulated)
    CUDA context — it never allocated memory of its own —, and None when the source cannot
    tell (NVML).
    """

    pid: int
    gpu_index: int
    used_mib: int | None
    allocated: bool | None = None


@runtime_checkable
class Probe(Protocol):
    """What the engine reads GPUs through: NVML, the simulated device, the host's memory.

    Implementations must be safe to call from the sampler thread; the methods may block
    (NVML calls do) but must not raise for a single unreadable field.
    """

    source: str  # "nvml", "simulated", "host", or several joined by "+"
    simulated: bool
    driver_version: str | None

    def devices(self) -> list[GpuReading]:
        """A reading of every device, ordered by index."""
        ...

    def processes(self) -> list[ProcessReading]:
        """Every process holding memory on any device."""
        ...

    def close(self) -> None:
        """Release the source; idempotent."""
        ...


def track(probe: Probe, pid: int) -> None:
    """Tell ``probe`` that ``pid`` (a worker just started) is the engine's, when it follows
    processes itself (the host device's; a GPU's driver lists them on its own)."""
    _tell(probe, "track", pid)


def own(probe: Probe, pid: int) -> None:
    """Tell ``probe`` that ``pid`` is part of the engine itself (its lifeline, a ``yield_when``
    command), when it follows processes itself: never listed, nor what it starts, as the
    engine's own process is not (the host reserve covers the engine; a GPU's driver never
    lists a process that holds nothing there)."""
    _tell(probe, "own", pid)


def _tell(probe: Probe, hook: str, pid: int) -> None:
    """Call ``probe``'s ``hook`` with ``pid`` when it has one (only the host's follows
    processes itself)."""
    method = getattr(probe, hook, None)
    if method is not None:
        method(pid)
