"""A worker process's states and every move between them, as one table (the spec).

A worker is ``starting`` from its spawn until it connects, ``initializing`` while it loads
its model, ``ready`` for a request, ``busy`` while it runs one; ``asleep`` from the moment
the engine asks an idle worker that can sleep to give its memory back (its process stays)
until it is awake again (``ready``: its next job can run) — a sleep or a wake that fails or
hangs ends in ``stopping``; ``stopping`` once the engine asked it to go; and it ends ``cold``
(it exited when asked) or ``crashed`` (any other end: a crash, a kill, a start that failed),
states nothing leaves.  A worker that says "ready"
with both its connections attached may skip ``initializing``.

Every change of a worker's state goes through :func:`check` (``SupervisedProcess`` calls it);
any move not in :data:`TRANSITIONS` raises :class:`~supervisor.jobs.states.IllegalTransition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from ..jobs.states import IllegalTransition


class WorkerState(StrEnum):
    COLD = "cold"
    STARTING = "starting"
    INITIALIZING = "initializing"
    READY = "ready"
    BUSY = "busy"
    ASLEEP = "asleep"
    STOPPING = "stopping"
    CRASHED = "crashed"


_ENDS = frozenset({WorkerState.STOPPING, WorkerState.CRASHED})

TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = MappingProxyType({
    WorkerState.STARTING: frozenset({WorkerState.INITIALIZING, WorkerState.READY, *_ENDS}),
    WorkerState.INITIALIZING: frozenset({WorkerState.READY, *_ENDS}),
    WorkerState.READY: frozenset({WorkerState.BUSY, WorkerState.ASLEEP, *_ENDS}),
    # its memory given back, its process alive: it wakes (ready), or is stopped
    WorkerState.ASLEEP: frozenset({WorkerState.READY, *_ENDS}),
    WorkerState.BUSY: frozenset({WorkerState.READY, *_ENDS}),
    # asked to go: it exits (cold), or dies first (crashed)
    WorkerState.STOPPING: frozenset({WorkerState.COLD, WorkerState.CRASHED}),
    WorkerState.COLD: frozenset(),
    WorkerState.CRASHED: frozenset(),
})

INITIAL = WorkerState.STARTING
FINAL = frozenset({WorkerState.COLD, WorkerState.CRASHED})
HOT = frozenset({WorkerState.READY, WorkerState.BUSY})


def check(old: WorkerState, new: WorkerState) -> None:
    """Raise :class:`IllegalTransition` unless a worker may move from ``old`` to ``new``."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition("worker", old.value, new.value)
