"""The engine's queue of waiting jobs, kept in the order the scheduler wants it.

Jobs stay sorted by ``(-priority, seq)`` (the scheduler's contract) and, alongside, the
scheduler's own ``QueuedJob`` view of each one and a count per (kind, backend), both maintained
incrementally so a scheduling step over 10,000 waiting jobs copies nothing it can reuse.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator

from ..scheduler.model import QueuedJob
from .record import Job


def _key(job: Job) -> tuple[int, int]:
    return (-job.priority, job.seq)


def _view(job: Job) -> QueuedJob:
    return QueuedJob(job.id, job.backend, job.priority, job.seq, job.submitted_at, job.passed,
                     job.kind, job.blocked_since)


class JobQueue:
    def __init__(self) -> None:
        self._jobs: list[Job] = []
        self._views: list[QueuedJob] = []
        self._frozen: tuple[QueuedJob, ...] | None = ()
        self.counts: Counter[tuple[str, str]] = Counter()  # (kind, backend) -> queued
        self.payload_bytes = 0  # what the queued jobs' payloads hold together

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def push(self, job: Job) -> None:
        i = bisect.bisect_right(self._jobs, _key(job), key=_key)
        self._jobs.insert(i, job)
        self._views.insert(i, _view(job))
        self.counts[(job.kind, job.backend)] += 1
        self.payload_bytes += len(job.payload)
        self._frozen = None

    def _index(self, job: Job) -> int:
        i = bisect.bisect_left(self._jobs, _key(job), key=_key)
        if i < len(self._jobs) and self._jobs[i] is job:
            return i
        return -1

    def remove(self, job: Job) -> bool:
        i = self._index(job)
        if i < 0:
            return False
        del self._jobs[i]
        del self._views[i]
        key = (job.kind, job.backend)
        self.payload_bytes -= len(job.payload)
        self.counts[key] -= 1
        if not self.counts[key]:
            del self.counts[key]
        self._frozen = None
        return True

    def set_passed(self, job: Job, passed: int) -> None:
        if job.passed != passed:
            job.passed = passed
            self._refresh(job)

    def set_blocked(self, job: Job, since: float) -> None:
        """Record when ``job`` was first found first in line and blocked (``Plan.blocked``)."""
        if job.blocked_since is None:
            job.blocked_since = since
            self._refresh(job)

    def _refresh(self, job: Job) -> None:
        i = self._index(job)
        if i >= 0:
            self._views[i] = _view(job)
            self._frozen = None

    def scheduler_view(self) -> tuple[QueuedJob, ...]:
        """The queue as the scheduler reads it (cached until the queue changes)."""
        if self._frozen is None:
            self._frozen = tuple(self._views)
        return self._frozen

    def clear(self) -> list[Job]:
        jobs = self._jobs
        self._jobs, self._views, self._frozen = [], [], ()
        self.counts.clear()
        self.payload_bytes = 0
        return jobs
