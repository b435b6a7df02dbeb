"""What the engine counts as it goes: loads, evictions, crashes, refusals, job outcomes, times.

The snapshot says what *is* (memory, states, queue); these say what *happened* since the
engine started, for ``/metrics`` and anyone else who asks.  The engine calls one method at
each point where something worth counting happens (a single line each, on the engine loop);
nothing here reads a clock or touches engine state, so it is cheap and plain to test.

Every label value comes from a fixed set (reasons, outcomes) or from the configured backends,
so no series can grow with input: no job ids, no free text.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .jobs import Job
    from .workers.handle import WorkerHandle

# Seconds; the last bucket is +Inf.  Queue waits and jobs run from milliseconds to an hour.
TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0, 1800.0, 3600.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

EVICTION_REASONS = ("asked", "room", "idle", "overuse", "others")
WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REFUSAL_REASONS = ("queue_full", "too_large", "stopping", "backend_failed", "other")
OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out")


@dataclass
class Histogram:
    """Cumulative-free bucket counts (one per upper bound, the last +Inf), a sum and a count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, count of observations <= le), …, ("+Inf", n)]`` as Prometheus wants them."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


def classify_refusal(reason: str) -> str:
    """The fixed label for a refusal's free-text reason (see ``scheduler.submit``)."""
    return "queue_full" if reason.startswith("queue full") else "too_large"


class Counters:
    """Counts kept by the engine (touched only on its loop)."""

    def __init__(self) -> None:
        self.loads: Counter[str] = Counter()
        self.load_failures: Counter[str] = Counter()
        self.crashes: Counter[str] = Counter()
        self.evictions: Counter[tuple[str, str]] = Counter()
        self.refusals: Counter[str] = Counter()
        self.jobs: Counter[tuple[str, str]] = Counter()
        self.load_seconds: dict[str, Histogram] = {}
        self.queue_wait: dict[str, Histogram] = {}
        self.duration: dict[str, Histogram] = {}
        self.sleeps: Counter[str] = Counter()
        self.sleep_failures: Counter[str] = Counter()
        self.wakes: Counter[str] = Counter()
        self.wake_seconds: dict[str, Histogram] = {}

    # -- engine hooks ---------------------------------------------------------------------
    def loaded(self, backend: str, seconds: float) -> None:
        """A worker of ``backend`` became ready for the first time, ``seconds`` after its
        start: one load (the engine tells each load once)."""
        self.loads[backend] += 1
        _hist(self.load_seconds, backend, LOAD_BUCKETS).observe(seconds)

    def worker_exited(self, handle: WorkerHandle, *, expected: bool, never_ready: bool) -> None:
        """A worker's process ended: a crash, a failed load, or a stop we asked for."""
        if expected:
            return
        if never_ready:
            self.load_failures[handle.backend] += 1
        else:
            self.crashes[handle.backend] += 1

    def evicted(self, backend: str, reason: str) -> None:
        """A worker is being stopped to free its memory: asked, for room, idle, or because
        it held more than its figures (``on_overuse: evict``)."""
        self.evictions[(backend, reason if reason in EVICTION_REASONS else "asked")] += 1

    def slept(self, backend: str) -> None:
        """A worker of ``backend`` is being put to sleep (for room, or asked)."""
        self.sleeps[backend] += 1

    def sleep_failed(self, backend: str) -> None:
        """A sleep or a wake of ``backend`` failed (or lied): its worker is stopped instead."""
        self.sleep_failures[backend] += 1

    def woke(self, backend: str, seconds: float) -> None:
        """A sleeping worker of ``backend`` woke, ``seconds`` after it was asked."""
        self.wakes[backend] += 1
        _hist(self.wake_seconds, backend, WAKE_BUCKETS).observe(seconds)

    def refused(self, reason: str) -> None:
        """A submit was refused (one of ``REFUSAL_REASONS``)."""
        self.refusals[reason if reason in REFUSAL_REASONS else "other"] += 1

    def refused_because(self, reason: str) -> None:
        """A submit was refused by admission with this free-text reason."""
        self.refused(classify_refusal(reason))

    def job_finished(self, job: Job) -> None:
        """A job reached its final state (calibration runs are not jobs here)."""
        if job.kind != "job":
            return
        self.jobs[(job.backend, job.state.value)] += 1
        if job.started_at is not None:
            _hist(self.queue_wait, job.backend, TIME_BUCKETS).observe(
                job.started_at - job.submitted_at)
            if job.finished_at is not None:
                _hist(self.duration, job.backend, TIME_BUCKETS).observe(
                    job.finished_at - job.started_at)

    def forget(self, backends: set[str]) -> None:
        """``backends`` are no longer configured (removed by a reload): their counts go, so
        that what is kept follows the configured backends (as ``/metrics`` shows them), not
        every name that was ever configured."""
        for table in (self.loads, self.load_failures, self.crashes, self.sleeps,
                      self.sleep_failures, self.wakes, self.load_seconds, self.queue_wait,
                      self.duration, self.wake_seconds):
            for name in backends & table.keys():
                del table[name]
        for pairs in (self.evictions, self.jobs):
            for key in [k for k in pairs if k[0] in backends]:
                del pairs[key]


def _hist(table: dict[str, Histogram], key: str, bounds: tuple[float, ...]) -> Histogram:
    hist = table.get(key)
    if hist is None:
        hist = table[key] = Histogram(bounds)
    return hist
