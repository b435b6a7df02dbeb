"""A job's states and every move between them, as one table (the spec: h11's ``_state.py`` is
the model).

A job is ``queued`` until admission places it; ``starting`` while the worker it was admitted
to is being started; ``running`` once its request went to a worker (or its calibration run
began); then it ends in exactly one of the four final states, which nothing leaves.  A job
that never ran goes back to ``queued`` when its worker failed to start, and one the engine
stopped under (journaled, and recovered at the next start) is requeued the same way.

Every change of a job's state goes through :func:`check` (``Job.mark`` calls it); any move
not in :data:`TRANSITIONS` raises :class:`IllegalTransition`, a bug in the engine, never a
user's mistake.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from ..errors import EngineBug


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
        return self in FINISHED


FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                      JobState.TIMED_OUT})
ACTIVE = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
_ENDS = FINISHED

#: state -> the states it may move to (and why, for the reader).
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType({
    # admitted: to a worker being started, or straight to a hot one (or a calibration run);
    # or it ends without having run (cancelled, timed out, its backend failed or is gone)
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.RUNNING, *_ENDS}) - {
        JobState.SUCCEEDED},
    # its worker became ready (running), failed to start (back to the queue, or failed),
    # or the job was cancelled first
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.QUEUED, *_ENDS}) - {
        JobState.SUCCEEDED},
    # it ends; or the engine stopped under it and recovery requeues it (marked interrupted)
    JobState.RUNNING: frozenset({JobState.QUEUED, *_ENDS}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMED_OUT: frozenset(),
})

INITIAL = JobState.QUEUED


class IllegalTransition(EngineBug):
    """A change of state the table does not allow: the engine has a bug."""

    def __init__(self, what: str, old: str, new: str) -> None:
        super().__init__(f"illegal {what} transition {old} -> {new}")
        self.old, self.new = old, new


def check(old: JobState, new: JobState) -> None:
    """Raise :class:`IllegalTransition` unless a job may move from ``old`` to ``new``."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition("job", old.value, new.value)
