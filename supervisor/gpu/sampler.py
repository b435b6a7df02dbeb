"""Polling a probe on its own thread (NVML calls block), and a bounded history of readings.

``Sampler`` reads devices at ``device_hz`` and processes at ``process_hz`` (20 Hz for both
while calibrating, ``set_fast(True)``) and hands each ``Sample`` to ``on_sample`` *on the
sampler thread*: the engine's callback must hop to its loop (``loop.call_soon_threadsafe``).
A probe or callback exception is logged and polling goes on.

``History`` is pure (no clock, no threads): a ring of (t, value) points per key.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from supervisor.clock import monotonic
from supervisor.gpu.model import GpuReading, Probe, ProcessReading

log = logging.getLogger(__name__)

FAST_HZ = 20.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sample:
    """One tick: ``processes`` is None on ticks that did not poll them (or where it failed).
    Stamped ``t`` as its reads began; they took ``read_s``, so what it shows is of some
    instant of ``[t, t + read_s]`` (long on a busy machine)."""

    t: float
    devices: tuple[GpuReading, ...]
    processes: tuple[ProcessReading, ...] | None
    read_s: float = 0.0


class Sampler:
    """A daemon thread polling ``probe``; ``start()`` once, ``stop()`` joins promptly."""

    def __init__(
        self,
        probe: Probe,
        on_sample: Callable[[Sample], None],
        device_hz: float = 4.0,
        process_hz: float = 2.0,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        """``clock`` stamps samples and drives the schedule (waits are real time)."""
        if device_hz <= 0 or process_hz <= 0:
            raise ValueError("sampling rates must be > 0 Hz")
        self._probe = probe
        self._on_sample = on_sample
        self._rates = (float(device_hz), float(process_hz))
        self._clock = clock
        self._fast = False
        # a fresh pair per start(): a thread left inside a hung probe call by stop() keeps
        # its own (set) stop event and can never resume alongside a newer thread
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reschedule = False
        self._thread: threading.Thread | None = None
        self._last_error: dict[str, str] = {}

    @property
    def fast(self) -> bool:
        return self._fast

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set_fast(self, fast: bool) -> None:
        """20 Hz for devices and processes (calibration), or back to the normal rates."""
        if fast != self._fast:
            self._fast = fast
            self._reschedule = True
            self._wake.set()

    def start(self) -> None:
        if self.running:
            raise RuntimeError("sampler already running")
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop, self._wake), name="vramtui-sampler", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling; waits at most ``timeout`` s for a probe call in flight to return."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("sampler thread still inside a probe call after %.1f s", timeout)
        self._thread = None

    # -- the thread --------------------------------------------------------------------------

    def _periods(self) -> tuple[float, float]:
        if self._fast:
            return 1.0 / FAST_HZ, 1.0 / FAST_HZ
        device_hz, process_hz = self._rates
        return 1.0 / device_hz, 1.0 / process_hz

    def _run(self, stop: threading.Event, wake: threading.Event) -> None:
        dev_period, proc_period = self._periods()
        next_tick = next_procs = self._clock()
        while not stop.is_set():
            if self._reschedule:
                self._reschedule = False
                dev_period, proc_period = self._periods()
                next_tick = next_procs = self._clock()
            now = self._clock()
            if now >= next_tick:
                # half a device period of slack so that, e.g., 4 Hz / 2 Hz alternate exactly
                poll_procs = now >= next_procs - dev_period / 2
                self._tick(now, poll_procs, stop)
                next_tick = max(next_tick + dev_period, now)
                if poll_procs:
                    next_procs = max(next_procs + proc_period, now)
            delay = min(next_tick, next_procs) - self._clock()
            if delay > 0:
                wake.wait(delay)
                wake.clear()

    def _tick(self, now: float, poll_procs: bool, stop: threading.Event) -> None:
        # Processes first: a worker that exits between the two reads is still listed while
        # the device shows its memory free, so the engine's ledger still counts it (room
        # understated a moment), never the reverse — memory neither held nor free, for which
        # admission would stop another worker (``Monitor.processes_now`` reads so too).
        processes = self._guard("processes", self._probe.processes) if poll_procs else None
        devices = self._guard("devices", self._probe.devices)
        if devices is None:
            return
        if stop.is_set():
            return  # stop() has returned: deliver nothing more
        sample = Sample(
            now, tuple(devices), tuple(processes) if processes is not None else None,
            max(0.0, self._clock() - now),
        )
        self._guard("on_sample", lambda: self._on_sample(sample))

    def _guard(self, what: str, call: Callable[[], T]) -> T | None:
        """Run ``call``; log an exception (with traceback the first time it changes)."""
        try:
            result = call()
        except Exception as exc:
            text = repr(exc)
            if self._last_error.get(what) != text:
                self._last_error[what] = text
                log.exception("sampler: %s failed", what)
            else:
                log.debug("sampler: %s failed again: %s", what, text)
            return None
        self._last_error.pop(what, None)
        return result


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class History(Generic[K, V]):
    """A bounded ring of ``(t, value)`` points per key, oldest first.

    Bounded by count (``max_len``, default 10 min at 4 Hz) and by age (``max_age`` seconds,
    measured from the newest point of that key). Not thread-safe: the engine loop owns it.
    """

    def __init__(self, max_age: float = 600.0, max_len: int = 2400) -> None:
        if max_len < 1 or max_age <= 0:
            raise ValueError("max_len must be >= 1 and max_age > 0")
        self.max_age = max_age
        self.max_len = max_len
        self._rings: dict[K, deque[tuple[float, V]]] = {}

    def append(self, key: K, t: float, value: V) -> None:
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = deque(maxlen=self.max_len)
        ring.append((t, value))
        horizon = t - self.max_age
        while ring and ring[0][0] < horizon:
            ring.popleft()

    def points(self, key: K, since: float | None = None) -> list[tuple[float, V]]:
        """Points of ``key`` with ``t >= since`` (all when None), oldest first."""
        ring = self._rings.get(key)
        if not ring:
            return []
        if since is None:
            return list(ring)
        newer: list[tuple[float, V]] = []
        for point in reversed(ring):
            if point[0] < since:
                break
            newer.append(point)
        newer.reverse()
        return newer

    def latest(self, key: K) -> tuple[float, V] | None:
        ring = self._rings.get(key)
        return ring[-1] if ring else None

    def keys(self) -> list[K]:
        return list(self._rings)

    def forget(self, key: K) -> None:
        self._rings.pop(key, None)

    def __len__(self) -> int:
        return len(self._rings)
