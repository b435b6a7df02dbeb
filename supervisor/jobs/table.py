"""The engine's table of jobs: the one owner of which jobs exist and who waits for them.

It holds every job the engine keeps in memory: the waiting ones (also in the queue, in run
order), the running ones, and the most recent finished ones, bounded in count and in the
bytes of their results (older ones are found in the journal).  Each job not yet finished has
a future that resolves with its final view: that is how a door waits for a job
(:mod:`supervisor.doors.watch` is its only reader outside the engine).  The table also keeps
the requests of recent jobs for ``retry`` (:class:`KeptRequests`), and why each queued job
waits (the scheduler's last word, read only when a job is shown).

Only the engine loop touches it.  It changes no job's state: the engine does, through
``Job.mark``; the table is told (:meth:`add`, :meth:`dequeue`, :meth:`ended`).
"""

from __future__ import annotations

import concurrent.futures
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..clock import WallClock
from ..errors import EngineStopped, UnknownJob
from ..results import JobRequest
from .queue import JobQueue
from .record import Job, JobView
from .states import JobState

KEEP_REQUESTS = 500  # requests kept for retry ...
KEEP_REQUEST_BYTES = 64 * 1024 * 1024  # ... and their bytes at most


@dataclass(frozen=True, slots=True)
class KeptRequest:
    backend: str
    payload: bytes
    timeout: float | None
    metadata: dict[str, Any]
    stream: bool


class KeptRequests:
    """The last requests submitted (a job's payload is dropped once it ends), for retry.

    The payload is the job's own bytes object (nothing is copied while the job lives); the
    oldest go first past ``max_items`` requests or ``max_bytes`` bytes.
    """

    def __init__(self, max_items: int = KEEP_REQUESTS, max_bytes: int = KEEP_REQUEST_BYTES):
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, KeptRequest] = OrderedDict()
        self._bytes = 0

    def keep(self, job: Job) -> None:
        if len(job.payload) > self.max_bytes:
            return
        self._kept[job.id] = KeptRequest(job.backend, job.payload, job.timeout,
                                         dict(job.metadata), job.stream)
        self._bytes += len(job.payload)
        while len(self._kept) > self.max_items or self._bytes > self.max_bytes:
            _, old = self._kept.popitem(last=False)
            self._bytes -= len(old.payload)

    def get(self, job_id: str) -> KeptRequest | None:
        return self._kept.get(job_id)

    def __len__(self) -> int:
        return len(self._kept)


class JobTable:
    """Every job the engine holds in memory; see the module doc."""

    def __init__(self, wall: WallClock, *, recent_jobs: int = 200,
                 max_recent_bytes: int = 256 * 1024 * 1024) -> None:
        self.wall = wall
        self.queue = JobQueue()  # sorted by (-priority, seq): the scheduler's contract
        self.kept = KeptRequests()
        self.recent_jobs = recent_jobs
        self.max_recent_bytes = max_recent_bytes
        self._jobs: dict[str, Job] = {}
        self._futures: dict[str, concurrent.futures.Future[JobView]] = {}
        self._recent: deque[str] = deque()
        self._recent_bytes: dict[str, int] = {}  # result bytes of each job in _recent
        self._recent_held = 0  # their sum (kept as it changes: a job's end is O(1))
        self._waiting: Mapping[str, str] = {}

    # -- looking up ---------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def require(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[str]:
        """The ids of the jobs held (a copy: safe to change the table meanwhile)."""
        return iter(list(self._jobs))

    def values(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def live(self) -> Iterator[Job]:
        """The jobs not finished yet."""
        return (j for j in list(self._jobs.values()) if not j.state.finished)

    def recent(self) -> Iterator[Job]:
        """The finished jobs kept in memory, newest first."""
        return (self._jobs[j] for j in reversed(self._recent) if j in self._jobs)

    def future(self, job_id: str) -> concurrent.futures.Future[JobView] | None:
        """What resolves with the job's final view (None once it ended, or if unknown)."""
        return self._futures.get(job_id)

    def request(self, job_id: str, limit: int) -> JobRequest | None:
        """The first ``limit`` bytes of a job's request: a live job's own, or a finished one's
        while it is kept (None: neither)."""
        job = self._jobs.get(job_id)
        payload: bytes | None = None
        if job is not None and not job.state.finished:
            payload = job.payload
        elif (kept := self.kept.get(job_id)) is not None:
            payload = kept.payload
        if payload is None:
            return None
        return JobRequest(job_id, len(payload), payload[:limit])

    # -- views --------------------------------------------------------------------------------
    def set_waiting(self, reasons: Mapping[str, str]) -> None:
        """Why each queued job waits, as the scheduler last said (read lazily)."""
        self._waiting = reasons

    def position(self, job: Job) -> int | None:
        """Its place in the run order (1 runs next), while it waits."""
        if job.state is not JobState.QUEUED:
            return None
        return next((i for i, j in enumerate(self.queue, 1) if j is job), None)

    def positions(self) -> dict[str, int]:
        return {job.id: i for i, job in enumerate(self.queue, 1)}

    def view(self, job: Job, position: int | None = None, *, light: bool = False) -> JobView:
        """The job now (a queued one with why it waits)."""
        if job.state is JobState.QUEUED:
            job.waiting = self._waiting.get(job.id, "")
        return job.view(position, light=light, clock=self.wall)

    # -- changes ------------------------------------------------------------------------------
    def add(self, job: Job, *, keep_request: bool = False) -> None:
        """A new job (or one recovered from the journal): waited for from now on, and queued
        while it is."""
        self._jobs[job.id] = job
        self._futures[job.id] = concurrent.futures.Future()
        if keep_request:
            self.kept.keep(job)
        if job.state is JobState.QUEUED:
            self.queue.push(job)

    def enqueue(self, job: Job) -> None:
        """A job back in the queue (its worker failed to start; a new priority)."""
        assert job.state is JobState.QUEUED, job.state
        self.queue.push(job)

    def dequeue(self, job: Job) -> None:
        self.queue.remove(job)

    def ended(self, job: Job) -> JobView:
        """``job`` has finished: its waiters hear it, it joins the recent ones (the oldest
        leave, past the count or the bytes of results kept).  Its final view."""
        assert job.state.finished, job.state
        view = self.view(job)
        self._resolve(job.id, view)
        self._keep_recent(job)
        return view

    def _keep_recent(self, job: Job) -> None:
        self._recent.append(job.id)
        size = len(job.data or b"") + sum(map(len, job.chunks))
        self._recent_held += size - self._recent_bytes.get(job.id, 0)
        self._recent_bytes[job.id] = size
        while len(self._recent) > self.recent_jobs or (
                len(self._recent) > 1 and self._recent_held > self.max_recent_bytes):
            old = self._recent.popleft()
            self._jobs.pop(old, None)
            self._recent_held -= self._recent_bytes.pop(old, 0)

    def restore(self, finished: Iterable[Job]) -> None:
        """The jobs that finished before the engine started (from its journal, newest first):
        recent ones again, as if they had just ended, so every listing shows them."""
        for job in reversed(tuple(finished)):
            assert job.state.finished, job.state
            if job.id not in self._jobs:
                self._jobs[job.id] = job
                self._keep_recent(job)

    def abandoned(self, job: Job, why: str) -> None:
        """Nobody will finish ``job`` in this run of the engine (it stops): its waiters hear
        why; a journaled job stays to run again after a restart."""
        self._resolve(job.id, why)

    def _resolve(self, job_id: str, outcome: JobView | str) -> None:
        fut = self._futures.pop(job_id, None)
        if fut is None or fut.done():
            return
        if isinstance(outcome, str):
            fut.set_exception(EngineStopped(f"job {job_id}: {outcome}"))
        else:
            fut.set_result(outcome)
