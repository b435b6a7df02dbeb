"""The GPUs as the engine last saw them, through the injected GPU reader (the probe).

:class:`Monitor` owns the sampler thread that polls the probe (NVML calls block) and what the
samples say: each device's last reading and its history, the processes on the GPUs and the
backend each works for (the one attribution, made each sample from the workers' process
trees), and on each GPU the memory that none of ours holds (foreign).  On the host device
every process of ours is listed, a GPU worker's too (its interpreter, its weights on their
way to the GPU, a sleeper's offloaded weights): what ours placed on other devices hold
there is foreign to the host device's holders, but no stranger's (``elsewhere``).  Samples
reach the
engine loop through the callback given to :meth:`start`; everything else here runs there.

Readings never lag a process list acted on. Admission's room on a GPU is the least of what
the ledger leaves and the device's free reading, and the ledger lets go of a worker's memory
(a ghost, a sleep's release) when a process list no longer shows it: a process list read
*after* the device reading would un-count memory the reading still shows used, counted
neither as on its way back nor as free — and admission would evict again for room that is
already coming. So a process list read between samples (:meth:`processes_now`) brings the
devices, read right after it, and a sample read before the readings held is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from supervisor.clock import monotonic

from ..gpu.model import GpuReading, Probe, ProcessReading, own, track
from ..gpu.sampler import History, Sample, Sampler
from ..ledger import Device, foreign_mib
from ..snapshot import KIND_LABELS

HISTORY_STEP_S = 0.25  # at most 4 points a second in the GPU history, whatever the sample rate


class Monitor:
    """What the engine sees of its GPUs (see the module doc)."""

    def __init__(self, probe: Probe, sample_hz: float, notice: str | None = None) -> None:
        self.probe = probe
        self.notice = notice  # what to tell about the probe (no driver: simulated…)
        self.sample_hz = sample_hz
        self.readings: dict[int, GpuReading] = {}
        self.history: History[int, int] = History()
        self.processes: tuple[ProcessReading, ...] = ()  # at the last process sample
        self.owners: dict[int, str] = {}  # pid -> the backend it works for, at that sample
        self.foreign: dict[int, int] = {}  # GPU -> MiB held by processes that are not ours
        # host device -> MiB of it held by our processes placed on other devices (in foreign)
        self.elsewhere: dict[int, int] = {}
        self._sampler: Sampler | None = None
        self._history_at: dict[int, float] = {}
        devices = probe.devices()
        self._sources = {r.index: r.source or probe.source for r in devices}
        self._identity = {r.index: r.name or device_kind(r, probe) for r in devices}
        self._told: dict[str, frozenset[int]] = {}  # what the probe said of processes, by kind
        self.clock: Callable[[], float] = monotonic  # stamps every sample
        self._read_at: float | None = None  # the stamp of the readings held

    def start(self, on_sample: Callable[[Sample], None]) -> None:
        """Read the devices once, then sample them on a thread (``on_sample`` is called on
        that thread)."""
        for reading in self.probe.devices():
            self.readings[reading.index] = reading
        self._sampler = Sampler(self.probe, on_sample, device_hz=self.sample_hz,
                                process_hz=self.sample_hz, clock=self.clock)
        self._sampler.start()

    def track(self, pid: int) -> None:
        """A worker started: a probe that follows processes itself reads it from now on."""
        track(self.probe, pid)

    def own(self, pid: int) -> None:
        """A process of the engine itself (its lifeline, a ``yield_when`` command): never
        read as on a device, nor what it starts."""
        own(self.probe, pid)

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def set_fast(self, fast: bool) -> None:
        """20 Hz sampling (a calibration runs), or back to the normal rate."""
        if self._sampler is not None:
            self._sampler.set_fast(fast)

    # -- a sample -----------------------------------------------------------------------------
    def took(self, sample: Sample) -> bool:
        """Take in ``sample``'s device readings (and its processes, when it has them: True);
        a sample read before the readings held (:meth:`processes_now` read since) is dropped
        whole: readings never go back in time."""
        if self._read_at is not None and sample.t < self._read_at:
            return False
        if sample.devices:
            self._read_at = sample.t
        for reading in sample.devices:
            self.readings[reading.index] = reading
            if reading.used_mib is not None and \
                    sample.t - self._history_at.get(reading.index, -1e9) >= HISTORY_STEP_S:
                self._history_at[reading.index] = sample.t
                self.history.append(reading.index, sample.t, reading.used_mib)
        if sample.processes is None:
            return False
        self.processes = sample.processes
        return True

    async def processes_now(self) -> tuple[ProcessReading, ...]:
        """The processes on the GPUs now (read off the loop; what the reader raises is
        raised), and the devices read right after them taken in: what the ledger lets go of
        on this list is no longer used in the readings (see the module doc)."""
        sample = await asyncio.get_running_loop().run_in_executor(None, self._read_now)
        self.took(Sample(sample.t, sample.devices, None))
        assert sample.processes is not None
        return sample.processes

    def _read_now(self) -> Sample:
        """(On an executor thread.) The processes, then the devices, stamped in between."""
        processes = tuple(self.probe.processes())
        t = self.clock()
        return Sample(t, tuple(self.probe.devices()), processes)

    def total_mib(self, gpu: int) -> int | None:
        """GPU ``gpu``'s memory as last read (None: not read yet)."""
        reading = self.readings.get(gpu)
        return reading.total_mib if reading is not None and reading.total_mib else None

    def per_gpu(self) -> dict[int, dict[int, int]]:
        """GPU -> pid -> MiB, at the last process sample (a process the driver would not
        give a figure for counts 0)."""
        out: dict[int, dict[int, int]] = {}
        for p in self.processes:
            mine = out.setdefault(p.gpu_index, {})
            mine[p.pid] = mine.get(p.pid, 0) + (p.used_mib or 0)
        return out

    def on_gpu(self) -> set[int]:
        """The pids on any GPU at the last process sample."""
        return {p.pid for p in self.processes}

    def attributed(self, ours: Mapping[int, set[int]], owners: dict[int, str],
                   per_gpu: Mapping[int, Mapping[int, int]]) -> None:
        """The sample's attribution: whose each process is, and what is foreign."""
        self.owners = owners
        hosts = self.host_gpus()
        for index, reading in self.readings.items():
            here = per_gpu.get(index, {})
            self.foreign[index] = foreign_mib(reading.used_mib, here, ours.get(index, ()))
            if index in hosts:
                placed = ours.get(index, set())
                self.elsewhere[index] = min(self.foreign[index], sum(
                    mib for pid, mib in here.items() if pid in owners and pid not in placed))

    def strangers_mib(self, index: int) -> int:
        """What strangers hold on ``index``: its foreign memory less ours placed elsewhere."""
        return self.foreign.get(index, 0) - self.elsewhere.get(index, 0)

    # -- views ------------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return [Device(i, r.total_mib, r.used_mib, r.free_mib)
                for i, r in sorted(self.readings.items())]

    def summary(self) -> str:
        """``SIMULATED: GPU0 24576 MiB``, ``host memory: GPU0 22057 MiB``, each kind once."""
        kinds: dict[str, list[str]] = {}
        for i, r in sorted(self.readings.items()):
            kinds.setdefault(device_kind(r, self.probe), []).append(f"GPU{i} {r.total_mib} MiB")
        return "; ".join(f"{k}: {', '.join(v)}" for k, v in kinds.items()) or "no GPU"

    def identity(self, gpu: int) -> str:
        """What device ``gpu`` is, as it started: its name (``Simulated GPU (24 GiB)``)."""
        return self._identity.get(gpu, "")

    def host_gpus(self) -> frozenset[int]:
        """The host device's index (``--gpus host``), if there is one."""
        return frozenset(i for i, s in self._sources.items() if s == "host")

    def news(self, kind: str) -> frozenset[int]:
        """Processes the probe has just begun to list as ``kind``: ``estimated`` (counted at
        their RSS, their PSS unreadable: another user's) or ``orphans`` (ours, outliving
        their parent); the host device's, to be said once each."""
        now = frozenset(getattr(self.probe, kind, frozenset()))
        new = now - self._told.get(kind, frozenset())
        self._told[kind] = now
        return new

    def kinds(self) -> set[str]:
        """The sources of the devices: ``nvml``, ``simulated``, ``host``."""
        return set(self._sources.values())


def device_kind(reading: GpuReading, probe: Probe) -> str:
    """How a device's figures are labelled: SIMULATED, host memory, or its source (nvml)."""
    source = reading.source or probe.source
    return KIND_LABELS.get(source, source or "GPU")
