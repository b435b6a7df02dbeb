"""The sampler thread over a simulated probe, the pure History ring, and the monitor's
readings, never older than a process list acted on."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from pathlib import Path

import pytest

from supervisor.engine.monitor import Monitor
from supervisor.gpu.model import GpuReading, ProcessReading
from supervisor.gpu.sampler import History, Sample, Sampler
from supervisor.gpu.sim import SimulatedProbe

DEADLINE = 5.0


def take(samples: queue.Queue[Sample], n: int) -> list[Sample]:
    return [samples.get(timeout=DEADLINE) for _ in range(n)]


@pytest.fixture
def probe(tmp_path: Path) -> SimulatedProbe:
    """A 24 GiB simulated GPU on which this test process holds 1000 MiB."""
    pid = os.getpid()
    (tmp_path / f"{pid}.json").write_text(
        f'{{"pid": {pid}, "gpu": 0, "mib": 1000, "start_time": null}}'
    )
    return SimulatedProbe("sim:24GiB", tmp_path, context_mib=0)


def test_samples_arrive_with_processes_on_some_ticks(probe: SimulatedProbe) -> None:
    samples: queue.Queue[Sample] = queue.Queue()
    sampler = Sampler(probe, samples.put, clock=lambda: time.monotonic() + 1000.0)
    sampler.start()
    try:
        got = take(samples, 4)  # 4 Hz devices, 2 Hz processes
    finally:
        started = time.monotonic()
        sampler.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 1.0 and not sampler.running
    assert all(s.t > 1000.0 for s in got)
    assert [t.t for t in got] == sorted(t.t for t in got)
    assert got[0].devices[0].used_mib == 1000
    polled = [s.processes for s in got if s.processes is not None]
    assert got[0].processes is not None and any(s.processes is None for s in got)
    assert all(p == (ProcessReading(os.getpid(), 0, 1000, allocated=True),) for p in polled)


def test_fast_mode_polls_processes_every_tick(probe: SimulatedProbe) -> None:
    samples: queue.Queue[Sample] = queue.Queue()
    sampler = Sampler(probe, samples.put)
    sampler.start()
    try:
        take(samples, 1)
        sampler.set_fast(True)
        assert sampler.fast
        switched = time.monotonic()
        fast = [s for s in take(samples, 12) if s.t > switched]
    finally:
        sampler.stop()
    assert len(fast) >= 10
    assert all(s.processes is not None for s in fast)


class Flaky:
    """A probe that fails a few times, devices first, then processes."""

    source = "simulated"
    simulated = True
    driver_version = None

    def __init__(self) -> None:
        self.device_failures = 2
        self.process_failures = 4  # (read first: two go with the devices' failed ticks)

    def devices(self) -> list[GpuReading]:
        if self.device_failures:
            self.device_failures -= 1
            raise RuntimeError("devices broke")
        return [GpuReading(0, "flaky", 100, 0, 100, None, None, None)]

    def processes(self) -> list[ProcessReading]:
        if self.process_failures:
            self.process_failures -= 1
            raise RuntimeError("processes broke")
        return []

    def close(self) -> None:
        pass


def test_probe_and_callback_errors_are_logged_and_polling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    samples: queue.Queue[Sample] = queue.Queue()
    calls = 0

    def on_sample(sample: Sample) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("callback broke")
        samples.put(sample)

    sampler = Sampler(Flaky(), on_sample, device_hz=50.0, process_hz=50.0)
    with caplog.at_level(logging.DEBUG, logger="supervisor.gpu.sampler"):
        sampler.start()
        try:
            got = take(samples, 3)
        finally:
            sampler.stop()
    assert got[0].processes is None  # the fourth process failure (the third's tick: the
    # callback's)
    assert got[-1].processes == ()
    assert all(s.devices[0].name == "flaky" for s in got)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    messages = " ".join(r.getMessage() for r in errors)
    assert "devices failed" in messages and "on_sample failed" in messages
    assert len(errors) == 3  # the same error twice is logged with a traceback once


def test_start_twice_and_stop_before_start(probe: SimulatedProbe) -> None:
    sampler = Sampler(probe, lambda s: None)
    sampler.stop()  # nothing to stop
    sampler.start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            sampler.start()
    finally:
        sampler.stop()
    with pytest.raises(ValueError):
        Sampler(probe, lambda s: None, device_hz=0)


# --- History -------------------------------------------------------------------------------


def test_history_is_bounded_by_length_per_key() -> None:
    history: History[str, float] = History(max_len=3)
    for i in range(5):
        history.append("gpu0", float(i), i * 10.0)
    history.append("flux", 4.0, 1.0)
    assert history.points("gpu0") == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0)]
    assert history.points("flux") == [(4.0, 1.0)]
    assert history.points("nothing") == []
    assert sorted(history.keys()) == ["flux", "gpu0"] and len(history) == 2
    assert history.latest("gpu0") == (4.0, 40.0) and history.latest("nothing") is None


def test_history_is_bounded_by_age_and_filters_since() -> None:
    history: History[int, int] = History(max_age=10.0)
    for t in range(0, 30, 2):
        history.append(0, float(t), t)
    assert [t for t, _ in history.points(0)] == [18.0, 20.0, 22.0, 24.0, 26.0, 28.0]
    assert history.points(0, since=23.0) == [(24.0, 24), (26.0, 26), (28.0, 28)]
    assert history.points(0, since=100.0) == []
    history.forget(0)
    assert history.points(0) == []


def test_history_default_is_ten_minutes_at_4_hz() -> None:
    history: History[int, int] = History()
    for i in range(3000):
        history.append(0, i * 0.25, i)
    points = history.points(0)
    assert len(points) == 2400 and points[-1] == (2999 * 0.25, 2999)


def test_stop_does_not_wait_forever_for_a_hung_probe(probe: SimulatedProbe) -> None:
    entered, release = threading.Event(), threading.Event()

    class Hung(SimulatedProbe):
        def devices(self) -> list[GpuReading]:
            entered.set()
            release.wait(DEADLINE)
            return super().devices()

    hung = Hung("sim:1GiB", probe.ledger_dir)
    samples: queue.Queue[Sample] = queue.Queue()
    sampler = Sampler(hung, samples.put)
    sampler.start()
    assert entered.wait(DEADLINE)
    sampler.stop(timeout=0.1)
    assert not sampler.running
    release.set()  # the hung call returns after stop(): nothing is delivered
    with pytest.raises(queue.Empty):
        samples.get(timeout=0.2)


def test_a_sample_says_how_long_its_reads_took(probe: SimulatedProbe) -> None:
    """Stamped as its reads began; what it shows is of some instant until they ended (the
    calibration leaves out of a phase a sample whose reads spanned its mark)."""
    ticks = iter(range(1_000_000))
    elapsed: dict[str, float] = {"s": 0.0}

    class Slow(SimulatedProbe):  # its process read takes 0.3 s of the sampler's clock
        def processes(self) -> list[ProcessReading]:
            elapsed["s"] += 0.3
            return super().processes()

    def clock() -> float:
        return next(ticks) * 1e-6 + elapsed["s"]

    samples: queue.Queue[Sample] = queue.Queue()
    sampler = Sampler(Slow("sim:24GiB", probe.ledger_dir, context_mib=0), samples.put,
                      clock=clock)
    sampler.start()
    try:
        got = take(samples, 2)
    finally:
        sampler.stop()
    polled = [s for s in got if s.processes is not None]
    assert polled and all(0.3 <= s.read_s < 1.0 for s in polled), polled
    assert all(s.read_s < 0.01 for s in got if s.processes is None)


class Exiting:
    """A 4 GiB GPU on which pid 7 holds 1000 MiB until ``exit()``."""

    source = "fake"

    def __init__(self) -> None:
        self.held = {7: 1000}
        self.calls: list[str] = []

    def exit(self) -> None:
        self.held.pop(7)

    def devices(self) -> list[GpuReading]:
        self.calls.append("devices")
        used = sum(self.held.values())
        return [GpuReading(0, "FAKE0", 4096, used, 4096 - used, None, None, None)]

    def processes(self) -> list[ProcessReading]:
        self.calls.append("processes")
        return [ProcessReading(pid, 0, mib, True) for pid, mib in self.held.items()]


def test_a_process_list_read_between_samples_brings_the_devices_read_after_it() -> None:
    # A worker exits after the last sample read the devices: the process list read now (to
    # let go of its memory at once) must come with a reading that no longer shows it used,
    # or admission sees the room neither as coming back nor as free, and evicts again.
    probe = Exiting()
    monitor = Monitor(probe, 10.0)  # type: ignore[arg-type]
    stale = Sample(monitor.clock(), tuple(probe.devices()), tuple(probe.processes()))
    assert monitor.took(stale) and monitor.readings[0].free_mib == 3096
    probe.exit()
    probe.calls.clear()
    assert asyncio.run(monitor.processes_now()) == ()
    assert probe.calls == ["processes", "devices"]
    assert monitor.readings[0].free_mib == 4096
    # a sample read before that, delivered after it, is dropped: readings never go back
    assert not monitor.took(stale) and monitor.readings[0].free_mib == 4096
    assert monitor.processes == stale.processes  # (nor its process list taken)
    later = Sample(monitor.clock(), tuple(probe.devices()), tuple(probe.processes()))
    assert monitor.took(later) and monitor.processes == ()


def test_a_tick_reads_processes_before_devices(probe: SimulatedProbe) -> None:
    """A worker that exits between the two reads must still be listed (its memory counted
    as leaving) when the reading shows it free, never gone from the list while the reading
    still shows it used."""
    calls: list[str] = []

    class Told(SimulatedProbe):
        def processes(self) -> list[ProcessReading]:
            calls.append("processes")
            return super().processes()

        def devices(self) -> list[GpuReading]:
            calls.append("devices")
            return super().devices()

    samples: queue.Queue[Sample] = queue.Queue()
    sampler = Sampler(Told("sim:24GiB", probe.ledger_dir, context_mib=0), samples.put)
    sampler.start()
    try:
        got = take(samples, 1)
    finally:
        sampler.stop()
    assert got[0].processes is not None  # the first tick polls both
    first = calls[:calls.index("devices") + 1]
    assert first.index("processes") < first.index("devices"), calls
