"""Questions about jobs that the faces ask: which jobs, where one stands in the queue, and why.

Runs on the engine loop and reads the engine only through what it offers publicly (its job
table, ``job_view``); returns frozen :class:`JobView` objects.  A job the engine no longer
holds in memory is looked up in the journal by ``job_view``.

The rules of a listing (how many jobs it may ask for, the states it may name) are here and
nowhere else: the API method ``jobs`` (:mod:`supervisor.apispec`) checks its arguments with
:func:`limit_problem` and :func:`states_problem`, and its backends with :func:`check_backends`
(the engine's knowledge), and every door (the CLI's ``vramtui jobs``,
HTTP's ``GET /v1/jobs``) goes through that method.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import UnknownBackend
from .record import Job, JobView
from .states import ACTIVE, FINISHED, JobState

if TYPE_CHECKING:
    from ..engine import Engine

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
MIN_LIMIT = 1
MAX_LISTED_BACKENDS = 64  # backends one listing may name (each is looked up, maybe in the journal)
STATE_GROUPS = {"active": ACTIVE, "finished": FINISHED}


def parse_states(text: str | None) -> frozenset[JobState] | None:
    """``"queued,running"`` / ``"active"`` / ``"finished"`` -> states; None or "" -> all.

    Raises ValueError naming the accepted words for anything else.
    """
    if not text:
        return None
    states: set[JobState] = set()
    for word in (w.strip().lower() for w in text.split(",")):
        if not word:
            continue
        if word in STATE_GROUPS:
            states |= STATE_GROUPS[word]
            continue
        try:
            states.add(JobState(word))
        except ValueError:
            known = ", ".join([*(s.value for s in JobState), *STATE_GROUPS])
            raise ValueError(f"unknown job state {word!r}; use one or more of: {known}") \
                from None
    return frozenset(states) if states else None


def states_problem(text: str) -> str | None:
    """Why ``text`` names no states a listing may ask for (None: it does)."""
    try:
        parse_states(text)
    except ValueError as exc:
        return f"names {exc}"
    return None


def limit_problem(limit: int) -> str | None:
    """Why ``limit`` is no number of jobs a listing may ask for (None: it is)."""
    if MIN_LIMIT <= limit <= MAX_LIMIT:
        return None
    return f"must be a number of jobs from {MIN_LIMIT} to {MAX_LIMIT}"


def check_backends(engine: Engine, names: Iterable[str]) -> None:
    """UnknownBackend for a name that is neither configured nor has any job the engine holds
    or its journal keeps: a backend a reload removed still has its jobs listed."""
    for name in names:
        if name in engine.backends or any(j.backend == name for j in engine.jobs.values()) \
                or engine.journal.holds_backend(name):
            continue
        raise UnknownBackend(name, engine.backends)


def job_detail(engine: Engine, job_id: str) -> JobView:
    """A job's view with its queue position and, while it waits, why (UnknownJob if none)."""
    view = engine.job_view(job_id)
    if view.state is JobState.QUEUED:
        job = engine.jobs.get(job_id)
        if job is not None:
            view = engine.jobs.view(job, engine.jobs.position(job))
    return view


def list_jobs(engine: Engine, *, states: Iterable[JobState] | None = None,
              backends: Iterable[str] = (), limit: int = DEFAULT_LIMIT) -> list[JobView]:
    """The jobs the engine holds, in the order that matters to whoever looks: the running
    ones (oldest first), then the queue in the order it runs, then the finished ones newest
    first, calibrations among them (one holds its GPU as a job does); filtered by state and
    backend, at most ``limit`` (checked by the caller: :func:`limit_problem`). A long queue
    never pushes the running jobs or the head of the queue out of a listing (newest first,
    they were the first cut)."""
    wanted = frozenset(states) if states is not None else None
    only = frozenset(backends)

    def kept(job: Job) -> bool:
        return (not only or job.backend in only) and (wanted is None or job.state in wanted)

    table = engine.jobs
    picked: list[JobView] = []
    started = sorted((j for j in table.live() if j.state is not JobState.QUEUED and kept(j)),
                     key=lambda j: j.seq)
    picked.extend(table.view(job) for job in started[:limit])
    if wanted is None or JobState.QUEUED in wanted:
        for position, job in enumerate(table.queue, 1):
            if len(picked) >= limit:
                return picked
            if kept(job):
                picked.append(table.view(job, position))
    if len(picked) < limit and (wanted is None or wanted & FINISHED):
        ended = sorted((j for j in table.values() if j.state.finished and kept(j)),
                       key=lambda j: j.seq, reverse=True)
        picked.extend(table.view(job) for job in ended[:limit - len(picked)])
    return picked
