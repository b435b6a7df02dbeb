"""Jobs: the engine's mutable record of each job, and the immutable views it hands out.

A :class:`Job` lives on the engine loop and is changed only there; :class:`JobView` is the
frozen copy that snapshots, events and ``wait`` results carry to other threads (events carry
a light one, without the result).
"""

from __future__ import annotations

import itertools
import os
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
        """The job now.  ``light`` leaves its result out (``data`` None, no ``chunks``): what
        events carry — results go to whoever asks for them (``wait``, ``job``)."""
        return JobView(
            id=self.id,
            backend=self.backend,
            state=self.state,
            priority=self.priority,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
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
            history=tuple(self.history),
            peak_mib=self.peak_mib,
            kind=self.kind,
        )
