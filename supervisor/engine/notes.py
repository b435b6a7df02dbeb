"""What the engine tells: its event log, its events, and its counters.

:class:`Notes` is the one place a line of the event log is written (the TUI's log, the
``log`` events and Python logging at once) and the one place the engine publishes an event.
An event nobody subscribed to is not even built (``EventHub.wants``).  Counters say what
happened since the start, for ``/metrics``.  Every line and event is stamped by the engine's
own clock as wall-clock seconds (``WallClock.now``), as its views' times are: the two agree
whatever the system clock does meanwhile.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..counters import Counters
from ..events import EngineEvent, EventHub
from ..jobs import Job, JobState
from ..snapshot import LogLine
from ..textsafe import visible

if TYPE_CHECKING:
    from ..jobs import JobView

log = logging.getLogger("supervisor")
LOG_LINES = 300


class Notes:
    """The event log, the event hub and the counters of one engine."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now  # wall-clock seconds, by the engine's clock
        self.lines: deque[LogLine] = deque(maxlen=LOG_LINES)
        self.events = EventHub()
        self.counters = Counters()  # what happened, for /metrics

    def warn_each(self, lines: Iterable[str]) -> None:
        """A warning line in the event log for each of ``lines``."""
        for line in lines:
            self.note("warning", line)

    def started(self, summary: str, notice: str | None, errors: Iterable[str],
                warnings: Iterable[tuple[str, str]]) -> None:
        """The engine is up: what it runs on, and what its descriptors could not say."""
        self.note("info", f"engine started: {summary}")
        if notice:
            self.note("warning", notice)
        for err in errors:
            self.note("error", err)
        for backend, warning in warnings:
            self.note("warning", f"descriptor warning: {warning}", backend)

    def note(self, level: str, text: str, backend: str | None = None, *,
             quiet: bool = False) -> None:
        """A line of the event log (the TUI's, the events' and Python logging's); ``quiet``
        lines (one per job) go to Python logging at debug level only."""
        text = visible(text)  # it may carry a process's words: one line, nothing that acts
        line = LogLine(self.now(), level, text, backend)
        self.lines.append(line)
        if quiet:
            log.debug(text)
        else:
            getattr(log, level if level in ("info", "error", "debug", "warning") else "info")(text)
        if self.events.wants("log"):
            self.events.publish(EngineEvent("log", line.t, message=text, level=level,
                                            backend=backend))

    def loaded(self, backend: str, gpu: int | None, seconds: float, *,
                preloaded: bool) -> None:
        """A worker's first ready: one load counted; a preload's is told (no job says it)."""
        self.counters.loaded(backend, seconds)
        if preloaded:
            self.note("info", f"{backend} ready on GPU{gpu} after {seconds:.1f} s (preloaded)",
                      backend)

    def job(self, view: JobView | None, backend: str, state: str) -> None:
        """A job changed (``view`` is light: no result)."""
        self.events.publish(EngineEvent("job", self.now(), job=view,
                                        job_id=view.id if view is not None else None,
                                        backend=backend, state=state))

    def job_ended(self, job: Job) -> None:
        """The end of a job in the event log: the queue's story, told from admission to end
        (one line a job: Python logging hears it at debug level only)."""
        took = ""
        if job.started_at is not None and job.finished_at is not None:
            took = f" after {job.finished_at - job.started_at:.1f} s"
        state = job.state
        if state is JobState.SUCCEEDED:
            level, text = "info", f"{job.id} ({job.backend}) succeeded{took}"
        elif state is JobState.FAILED:
            level, text = "warning", f"{job.id} ({job.backend}) failed{took}: {job.error}"
        else:
            level, text = "info", (f"{job.id} ({job.backend}) "
                                   f"{state.value.replace('_', ' ')}{took}: {job.error}")
        self.note(level, text, job.backend, quiet=True)

    def wants(self, kind: str) -> bool:
        return self.events.wants(kind)

    def worker(self, backend: str, state: str) -> None:
        if self.events.wants("worker"):
            self.events.publish(EngineEvent("worker", self.now(), backend=backend,
                                            state=state))

    def chunk(self, backend: str, job_id: str, data: bytes) -> None:
        if self.events.wants("chunk"):
            self.events.publish(EngineEvent("chunk", self.now(), backend=backend,
                                            job_id=job_id, data=data))

    def overuse(self, backend: str, message: str) -> None:
        self.events.publish(EngineEvent("overuse", self.now(), backend=backend,
                                        message=message))

    def sleep(self, backend: str, state: str, message: str, seconds: float | None) -> None:
        """A worker fell asleep, woke (``seconds``: what it took, measured), or was stopped
        instead (``state`` "asleep", "awake" or "stopped"; ``message`` says why)."""
        self.events.publish(EngineEvent("sleep", self.now(), backend=backend, state=state,
                                        message=message, seconds=seconds))

    def sample(self) -> None:
        if self.events.wants("sample"):
            self.events.publish(EngineEvent("sample", self.now()))

    def close(self) -> None:
        self.events.close()
