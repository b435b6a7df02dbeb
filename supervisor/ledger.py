"""The memory ledger: the one owner of what each worker holds on each GPU, now and next.

Pure, like the scheduler: plain values in, plain values out, no I/O, no clock, no threads.
Admission, eviction and the snapshots the faces see all read the same ``Book``.

Figures. A backend's admission footprint (``figures``) merges what its descriptor declares
with what was measured of it in production: the peak is the largest of the declared peak
and every peak or idle footprint observed; what stays resident is the measured resident if
known, else weights + context (or peak - activation), and when neither is known the whole
peak counts as resident — never 0 for a backend with a known peak. A figure that proved too
small is replaced by what was observed, from then on (and a declared split whose peak proved
too small is dropped with it).

Holdings. A worker holds the larger of what its figures imply for the jobs it runs
(``BackendInfo.holds_mib``: resident, plus activation + safety per running job; the whole
usable GPU for a backend whose footprint is unknown) and what was last observed of its
processes. A stopping worker holds the same until its processes have left the GPU, and an
exited one (a *ghost*) keeps what it held until the GPU's process list no longer shows it.
Memory on a GPU that none of ours holds is *foreign* (other users, orphans of an earlier
engine): ``device used - what our processes were seen to use``.

A GPU's budget is ``min(total - held - foreign, measured free) - reserve``; a GPU is over
committed when ``held + foreign > total``; a worker is over its figures when it was observed
above them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Learned:
    """What production measured of one backend (MiB; None: not measured yet).

    Every observation is a lower bound of the truth, so each raises the figures at once; but a
    backend with no declared peak shares a GPU only once ``peak_confirmed``: a job was sampled
    often enough while it ran (a short spike between two samples would be missed).
    """

    peak_mib: int | None = None  # the largest footprint seen with one job running
    resident_mib: int | None = None  # the largest footprint seen while idle
    peak_confirmed: bool = False


@dataclass(frozen=True, slots=True)
class Declared:
    """What a descriptor (with its calibration overlay) says; ``resident_mib`` None: the split
    between resident and per-job memory is not given."""

    peak_mib: int | None = None
    resident_mib: int | None = None


def figures(declared: Declared, learned: Learned) -> tuple[int | None, int | None]:
    """``(peak, activation)`` for admission; activation None when the split is unknown, and
    ``(None, None)`` — run alone — while no peak is declared nor confirmed by measurement."""
    if declared.peak_mib is None and not learned.peak_confirmed:
        return None, None
    peaks = [v for v in (declared.peak_mib, learned.peak_mib, learned.resident_mib)
             if v is not None]
    if not peaks:
        return None, None
    peak = max(peaks)
    declared_resident = declared.resident_mib
    if declared.peak_mib is not None and peak > declared.peak_mib:
        # The declared peak proved too small: its split between resident and per-job memory
        # is no better, so only what was measured of the resident counts.
        declared_resident = None
    residents = [v for v in (declared_resident, learned.resident_mib) if v is not None]
    if not residents:
        return peak, None
    resident = min(max(residents), peak)
    return peak, peak - resident


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of memory on one GPU: a worker, a ghost of one, or a calibration run."""

    name: str  # unique (the worker's name)
    backend: str
    gpu: int
    kind: str  # "worker", "ghost", "settling" (a finished job's memory) or "calibration"
    figures_mib: int  # what its figures imply now
    observed_mib: int | None = None  # its processes at the last sample (None: not seen)
    jobs: int = 0
    pids: frozenset[int] = frozenset()

    @property
    def holds_mib(self) -> int:
        """What it holds: never less than what was observed of it."""
        observed = self.observed_mib
        return self.figures_mib if observed is None else max(self.figures_mib, observed)

    @property
    def over_mib(self) -> int:
        """How far its processes were seen above its figures (0: within them)."""
        observed = self.observed_mib
        return 0 if observed is None else max(0, observed - self.figures_mib)


@dataclass(frozen=True, slots=True)
class GpuBook:
    """One GPU's accounts."""

    index: int
    total_mib: int
    reserve_mib: int
    used_mib: int | None  # the device's own reading (None: not available)
    free_mib: int | None
    foreign_mib: int
    holders: tuple[Holder, ...] = ()

    @property
    def held_mib(self) -> int:
        return sum(h.holds_mib for h in self.holders)

    @property
    def ours_observed_mib(self) -> int:
        return sum(h.observed_mib or 0 for h in self.holders)

    @property
    def budget_mib(self) -> int:
        """What admission may still hand out here (never negative)."""
        room = self.total_mib - self.held_mib - self.foreign_mib
        if self.free_mib is not None:
            room = min(room, self.free_mib)
        return max(0, room - self.reserve_mib)

    @property
    def overcommit_mib(self) -> int:
        """How far what is held exceeds the device (0: it fits)."""
        return max(0, self.held_mib + self.foreign_mib - self.total_mib)

    @property
    def over_reserve_mib(self) -> int:
        """How far what is held reaches into the device's reserve, or past it (0: it
        leaves the reserve free)."""
        return max(0, self.held_mib + self.foreign_mib + self.reserve_mib - self.total_mib)


@dataclass(frozen=True, slots=True)
class Book:
    """Every GPU's accounts at one instant."""

    gpus: Mapping[int, GpuBook] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", MappingProxyType(dict(self.gpus)))

    def holder(self, name: str) -> Holder | None:
        for gpu in self.gpus.values():
            for h in gpu.holders:
                if h.name == name:
                    return h
        return None

    def held_by(self, backend: str) -> int:
        """What every holder of ``backend`` holds, on every GPU."""
        return sum(h.holds_mib for g in self.gpus.values() for h in g.holders
                   if h.backend == backend)

    def observed_by(self, backend: str, kinds: Collection[str]) -> int | None:
        """What the processes of ``backend``'s holders of these kinds were seen to use at
        the last sample, on every GPU (None: none of them was seen)."""
        seen = [h.observed_mib for g in self.gpus.values() for h in g.holders
                if h.backend == backend and h.kind in kinds and h.observed_mib is not None]
        return sum(seen) if seen else None


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU's fixed size and latest reading, as the ledger needs them."""

    index: int
    total_mib: int
    used_mib: int | None = None
    free_mib: int | None = None


def foreign_mib(used_mib: int | None, process_mib: Mapping[int, int], ours: Iterable[int]) -> int:
    """Memory on a device that none of our processes holds: used - what ours were seen to use.

    ``process_mib`` maps pid -> MiB on that device. Processes the driver does not list (other
    containers) are foreign too: they are in ``used`` and not in ours.
    """
    if used_mib is None:
        return 0
    seen = sum(process_mib.get(pid, 0) for pid in set(ours))
    return max(0, used_mib - seen)


Reserve = int | Mapping[int, int]  # kept free on every GPU, or per GPU index


def reserve_on(reserve: Reserve, index: int) -> int:
    """What ``reserve`` keeps free on GPU ``index`` (a mapping without it: 0)."""
    return reserve if isinstance(reserve, int) else int(reserve.get(index, 0))


def book(
    devices: Sequence[Device],
    holders: Iterable[Holder],
    *,
    reserve_mib: Reserve = 0,
    foreign: Mapping[int, int] | None = None,
) -> Book:
    """The accounts of every device; holders on a device that is not present are dropped."""
    by_gpu: dict[int, list[Holder]] = {d.index: [] for d in devices}
    for h in holders:
        if h.gpu in by_gpu:
            by_gpu[h.gpu].append(h)
    foreign = foreign or {}
    return Book({
        d.index: GpuBook(
            index=d.index, total_mib=d.total_mib, reserve_mib=reserve_on(reserve_mib, d.index),
            used_mib=d.used_mib, free_mib=d.free_mib,
            foreign_mib=max(0, int(foreign.get(d.index, 0))),
            holders=tuple(sorted(by_gpu[d.index], key=lambda h: h.name)),
        )
        for d in devices
    })
