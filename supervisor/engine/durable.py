"""The engine's side of the journal: which jobs are durable, and how they go to disk and back.

A job is journaled (it survives an engine stop or crash) when the engine has a journal, the
job is an ordinary one (not a calibration run) and its submitter asked for it (``durable``;
a Dynamo request is not).  :class:`JobJournal` turns a job into the journal's record and
back (engine times to wall-clock ones, and back, through the engine's one
:class:`~supervisor.clock.WallClock`), keeps serving when a write fails (it says loudly what
was not kept), and says when the disk is full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..clock import WallClock
from ..jobs import Job, JobState
from ..journal import JobRecord, Journal

Note = Callable[..., None]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What the journal held when the engine last stopped, as jobs to requeue."""

    jobs: tuple[Job, ...]  # queued again, ids and order kept
    interrupted: int  # of them, were running when the engine stopped
    failed: tuple[JobRecord, ...]  # interrupted twice: not run a third time
    max_seq: int  # the largest job number the journal holds: new jobs are numbered after


class JobJournal:
    """The journal (None: the engine keeps no journal) as the engine uses it."""

    def __init__(self, journal: Journal | None, wall: WallClock, note: Note) -> None:
        self.journal = journal
        self.wall = wall
        self._note = note
        self._disk_full_noted = False

    def use(self, journal: Journal) -> None:
        """Keep jobs in ``journal`` from now on (opened as the engine starts)."""
        self.journal = journal

    def durable(self, job: Job) -> bool:
        """Whether ``job`` lives in the journal (and so survives an engine stop)."""
        return self.journal is not None and job.kind == "job" and job.durable

    def record(self, job: Job) -> JobRecord:
        w = self.wall.wall
        return JobRecord(
            id=job.id, seq=job.seq, backend=job.backend, payload=job.payload,
            priority=job.priority, timeout=job.timeout, metadata=job.metadata,
            stream=job.stream, submitted_wall=w(job.submitted_at), state=job.state,
            history=[(w(t), st, note) for t, st, note in job.history],
        )

    def job(self, rec: JobRecord) -> Job:
        """A job as the journal holds it, its times on the engine's clock again."""
        back = self.wall.engine_time
        job = Job(backend=rec.backend, payload=rec.payload, priority=rec.priority,
                  timeout=rec.timeout, metadata=dict(rec.metadata), stream=rec.stream,
                  id=rec.id, seq=rec.seq, state=rec.state)
        job.submitted_at = back(rec.submitted_wall)
        job.history = [(back(t), st, note) for t, st, note in rec.history]
        job.started_at = back(rec.started_wall) if rec.started_wall else None
        job.finished_at = back(rec.finished_wall) if rec.finished_wall else None
        job.data, job.headers, job.status_code = rec.data, dict(rec.headers), rec.status_code
        job.error, job.chunks = rec.error, list(rec.chunks)
        job.gpu, job.peak_mib = rec.gpu, rec.peak_mib
        return job

    def finished(self, job_id: str) -> Job | None:
        """A finished job the engine no longer holds in memory (None: not in the journal)."""
        if self.journal is None:
            return None
        rec = self.journal.finished(job_id)
        return self.job(rec) if rec is not None else None

    def holds_backend(self, backend: str) -> bool:
        """Whether the journal keeps any job of ``backend`` (False when it cannot say)."""
        if self.journal is None:
            return False
        try:
            return self.journal.holds_backend(backend)
        except Exception:  # noqa: BLE001 - a listing's question, not worth failing for
            return False

    def recent(self, limit: int, max_bytes: int) -> tuple[Job, ...]:
        """The jobs that finished last (before the engine started: it keeps the rest in
        memory), newest first, at most ``limit`` of them holding at most ``max_bytes`` of
        results; none when the journal cannot be read (said loudly)."""
        if self.journal is None or limit <= 0:
            return ()
        try:
            return tuple(self.job(rec) for rec in self.journal.recent(limit, max_bytes))
        except Exception as exc:  # noqa: BLE001 - the engine serves without them
            self._note("error", f"journal: the jobs that finished before this start could "
                       f"not be read ({exc}); `vramtui jobs` lists them no more")
            return ()

    # -- writing ------------------------------------------------------------------------------
    def submitted(self, job: Job) -> None:
        """Durable before the submitter hears "accepted": raises when it cannot be kept."""
        assert self.journal is not None
        self.journal.record_submit(self.record(job))

    def when(self, job: Job) -> float:
        """The time of ``job``'s latest history line, as the journal records it: the very
        wall-clock time its view shows (never a second reading of another clock)."""
        return self.wall.wall(job.history[-1][0])

    def write(self, what: str, *args: Any, **kwargs: Any) -> None:
        """One journal write (``record_state`` …) that must not stop the engine: a failure is
        said loudly, and the engine keeps serving."""
        if self.journal is None:
            return
        try:
            getattr(self.journal, what)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - keep serving; say loudly what was not kept
            self._note("error", f"journal: {what} failed: {exc}")

    def finish(self, job: Job, state: JobState, error: str | None, now: float
               ) -> tuple[JobState, str | None]:
        """Journal the finish at ``now`` (the engine time the job ends at); what was stored
        (a result the journal cannot hold fails the job, with the reason, and that failure is
        what is stored and reported)."""
        if self.journal is None:
            return state, error
        error = error if error is not None else job.error
        try:
            stored, why = self.journal.finish_durably(
                job.id, state, self.wall.wall(now), note=error or "", data=job.data,
                headers=job.headers, status_code=job.status_code, error=error,
                chunks=job.chunks, gpu=job.gpu, peak_mib=job.peak_mib)
        except Exception as exc:  # noqa: BLE001 - not even a failure could be stored
            stored, why = JobState.FAILED, (
                f"the journal could not record how this job ended ({exc}); it still holds it "
                "as unfinished, so it runs again when the engine restarts")
        if stored is not state or why != error:
            self._note("error", f"job {job.id} ({job.backend}) failed: {why}", job.backend)
            job.data, job.chunks, job.headers, job.status_code = None, [], {}, None
        if self.journal.reserve_spent and not self._disk_full_noted:
            self._disk_full_noted = True
            self._note("error", f"journal: the disk under {self.journal.path.parent} is full; "
                       "its reserve was spent to record the jobs already accepted, and new "
                       "jobs are refused until there is room again")
        elif not self.journal.reserve_spent:
            self._disk_full_noted = False
        return stored, why

    # -- recovery -----------------------------------------------------------------------------
    def recover(self) -> Recovered:
        """The jobs to requeue, as the journal held them (it requeued them: a job that was
        running is queued again, marked interrupted, or failed if it was twice)."""
        if self.journal is None:
            return Recovered((), 0, (), 0)
        if self.journal.damage is not None:
            self._note("error", "journal: " + self.journal.damage.describe())
        recovery = self.journal.recover(self.wall.now())
        jobs = tuple(self.job(rec) for rec in recovery.jobs)
        assert all(job.state is JobState.QUEUED for job in jobs)
        return Recovered(jobs, len(recovery.interrupted), tuple(recovery.failed),
                         recovery.max_seq)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
