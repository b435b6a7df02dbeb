"""Events the engine publishes, and subscriptions that never slow the engine down.

A subscriber gets a bounded queue.  When it falls behind, the oldest events are dropped and
``lagged`` is set: it should then take a fresh snapshot instead of replaying events.  Callbacks
run on the engine thread and must be quick (the TUI hands them on with ``call_from_thread``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .jobs import JobView


@dataclass(frozen=True, slots=True)
class EngineEvent:
    kind: str  # "job", "chunk", "worker", "sample", "log", "sleep", or "closed"
    t: float
    job: JobView | None = None
    job_id: str | None = None
    backend: str | None = None
    state: str | None = None
    message: str = ""
    level: str = "info"
    data: bytes | None = None
    seconds: float | None = None  # a sleep event: what the sleep (or the wake) took


_CLOSED = EngineEvent("closed", 0.0)


class Subscription:
    """A bounded queue of events; iterate it, or ``get(timeout)``."""

    def __init__(self, hub: EventHub, maxsize: int,
                 kinds: frozenset[str] | None, callback: Callable[[EngineEvent], Any] | None):
        self._hub = hub
        self.kinds = kinds
        self.callback = callback
        self.queue: queue.Queue[EngineEvent] = queue.Queue(maxsize)
        self.lagged = False
        self.dropped = 0

    def offer(self, event: EngineEvent) -> None:
        if self.kinds is not None and event.kind not in self.kinds and event is not _CLOSED:
            return
        if self.callback is not None:
            self.callback(event)
            return
        while True:
            try:
                self.queue.put_nowait(event)
                return
            except queue.Full:
                self.lagged = True
                self.dropped += 1
                with contextlib.suppress(queue.Empty):
                    self.queue.get_nowait()

    def get(self, timeout: float | None = None) -> EngineEvent | None:
        """The next event, or None after ``timeout`` seconds."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def __iter__(self) -> Iterator[EngineEvent]:
        while True:
            event = self.queue.get()
            if event is _CLOSED:
                return
            yield event

    def close(self) -> None:
        self._hub.unsubscribe(self)


class EventHub:
    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        # The kinds the subscriptions take (None: one takes every kind), set with _subs: what
        # wants() reads, once per event the engine may build.
        self._wanted: frozenset[str] | None = frozenset()
        self._closed = False

    def subscribe(self, *, maxsize: int = 1000, kinds: frozenset[str] | None = None,
                  callback: Callable[[EngineEvent], Any] | None = None) -> Subscription:
        """A subscription to the events from now on.  After :meth:`close`, one that is told at
        once that the engine has closed (it would wait for an event that never comes)."""
        sub = Subscription(self, maxsize, kinds, callback)
        with self._lock:
            closed = self._closed
            if not closed:
                self._set_subs([*self._subs, sub])
        if closed:
            sub.offer(_CLOSED)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._set_subs([s for s in self._subs if s is not sub])

    def _set_subs(self, subs: list[Subscription]) -> None:
        """The subscriptions from now on, and the kinds they take (set first: an event built
        for a subscription just leaving, or not yet in, is harmless)."""
        kinds: set[str] = set()
        for s in subs:
            if s.kinds is None:
                self._wanted = None
                break
            kinds |= s.kinds
        else:
            self._wanted = frozenset(kinds)
        self._subs = subs

    def wants(self, kind: str) -> bool:
        """Whether anyone listens to ``kind`` (an event nobody takes is not even built)."""
        wanted = self._wanted
        return wanted is None or kind in wanted

    def publish(self, event: EngineEvent) -> None:
        for sub in self._subs:
            sub.offer(event)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.publish(_CLOSED)
