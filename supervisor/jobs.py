"""Jobs: the engine's mutable record of each job, and the immutable views it hands out.

A :class:`Job` lives on the engine loop and is changed only there; :class:`JobView` is the
frozen copy that snapshots, events and ``wait`` results carry to other threads (events carry
a light one, without the result).

The engine keeps time on its monotonic clock (immune to clock changes); every time a view
carries is wall-clock (epoch seconds), converted here, at the view boundary, with the one
offset of :func:`wall_offset` (the journal uses it too).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"  # admitted; its worker is being started
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})

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


_MONO_TO_WALL = time.time() - time.monotonic()


def wall_offset(clock: Callable[[], float] = time.monotonic) -> float:
    """What to add to a time of ``clock`` to get wall-clock seconds (fixed per process for
    the monotonic clock, so that every view and the journal agree to the microsecond)."""
    return _MONO_TO_WALL if clock is time.monotonic else time.time() - clock()


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
    state: JobState = JobState.QUEUED
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

    def mark(self, now: float, state: JobState, note: str = "") -> None:
        self.state = state
        self.history.append((now, state.value, note))
        if state is JobState.RUNNING and self.started_at is None:
            self.started_at = now
        if state.finished:
            self.finished_at = now

    def view(self, position: int | None = None, *, light: bool = False) -> JobView:
        """The job now, its times as wall clock.  ``light`` leaves its result out (``data``
        None, no ``chunks``): what events carry — results go to whoever asks for them
        (``wait``, ``job``)."""
        w = _MONO_TO_WALL
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
