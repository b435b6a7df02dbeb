"""A job: the engine's mutable record of it, and the immutable view it hands out.

A :class:`Job` lives on the engine loop and is changed only there, its state only through
:meth:`Job.mark` (which checks the move against :mod:`.states`); :class:`JobView` is the
frozen copy that snapshots, events and ``wait`` results carry to other threads (events carry
a light one, without the result).  A job's times are the engine clock's; its view carries
them as wall-clock epoch seconds (:class:`supervisor.clock.WallClock`).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from ..clock import MONOTONIC, WallClock
from .states import INITIAL, JobState, check

_seq = itertools.count(1)
_last_seq = 0


def next_seq() -> int:
    global _last_seq
    _last_seq = next(_seq)
    return _last_seq


def advance_seq(past: int) -> None:
    """Number new jobs after ``past`` (the largest seq a journal already holds)."""
    global _seq
    if past >= _last_seq:
        _seq = itertools.count(past + 1)


def new_job_id() -> str:
    return "j-" + os.urandom(5).hex()


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as seen from outside the engine at one instant."""

    id: str
    backend: str
    state: JobState
    priority: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    progress: float | None
    progress_text: str
    gpu: int | None
    waiting: str
    passed: int
    position: int | None
    metadata: dict[str, Any]
    data: bytes | None
    headers: dict[str, Any]
    status_code: int | None
    chunks: tuple[bytes, ...]
    error: str | None
    history: tuple[tuple[float, str, str], ...]
    peak_mib: int | None
    kind: str = "job"

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def ran_s(self) -> float | None:
        """Seconds of its last run, the one that ended it (an engine restart in between
        requeues a job: the time it was down is not counted); None until it has ended."""
        if self.finished_at is None or self.started_at is None:
            return None
        start = next((t for t, state, _ in reversed(self.history) if state == "running"),
                     self.started_at)
        return max(0.0, self.finished_at - start)


@dataclass(eq=False, slots=True)
class Job:
    """The engine's record of one job (touched only on the engine loop)."""

    backend: str
    payload: bytes
    priority: int = 0
    timeout: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    id: str = field(default_factory=new_job_id)
    seq: int = field(default_factory=next_seq)
    submitted_at: float = 0.0
    state: JobState = INITIAL  # changed only by mark()
    started_at: float | None = None
    finished_at: float | None = None
    progress: float | None = None
    progress_text: str = ""
    gpu: int | None = None
    waiting: str = ""
    passed: int = 0
    blocked_since: float | None = None  # first found first in line and blocked for memory
    data: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    status_code: int | None = None
    chunks: list[bytes] = field(default_factory=list)
    error: str | None = None
    history: list[tuple[float, str, str]] = field(default_factory=list)
    peak_mib: int | None = None
    peak_samples: int = 0  # samples of its worker's memory while it ran alone there
    cancel_requested: bool = False
    cancel_state: JobState = JobState.CANCELLED
    kind: str = "job"  # or "calibration": a run that needs a GPU to itself
    durable: bool = True  # journaled (False: lost with the engine, e.g. Dynamo's requests)
    retried: bool = False  # run again once already, its server having died before answering

    def mark(self, now: float, state: JobState, note: str = "") -> None:
        """Move to ``state`` (IllegalTransition unless the table allows it), noted in the
        history."""
        check(self.state, state)
        self.state = state
        self.history.append((now, state.value, note))
        if state is JobState.RUNNING and self.started_at is None:
            self.started_at = now
        if state.finished:
            self.finished_at = now

    def begin(self, now: float, note: str = "") -> None:
        """The job enters the engine (queued): its submission time, its first history line."""
        self.submitted_at = now
        self.history.append((now, self.state.value, note))

    def note(self, now: float, note: str) -> None:
        """A line in the history that changes no state (a new priority, say)."""
        self.history.append((now, self.state.value, note))

    def view(self, position: int | None = None, *, light: bool = False,
             clock: WallClock = MONOTONIC) -> JobView:
        """The job now, its times as wall clock.  ``light`` leaves its result out (``data``
        None, no ``chunks``): what events carry — results go to whoever asks for them
        (``wait``, ``job``)."""
        w = clock.offset
        return JobView(
            id=self.id,
            backend=self.backend,
            state=self.state,
            priority=self.priority,
            submitted_at=self.submitted_at + w,
            started_at=None if self.started_at is None else self.started_at + w,
            finished_at=None if self.finished_at is None else self.finished_at + w,
            progress=self.progress,
            progress_text=self.progress_text,
            gpu=self.gpu,
            waiting=self.waiting,
            passed=self.passed,
            position=position,
            metadata=dict(self.metadata),
            data=None if light else self.data,
            headers=dict(self.headers),
            status_code=self.status_code,
            chunks=() if light else tuple(self.chunks),
            error=self.error,
            history=tuple((t + w, st, note) for t, st, note in self.history),
            peak_mib=self.peak_mib,
            kind=self.kind,
        )
