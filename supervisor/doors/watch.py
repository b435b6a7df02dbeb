"""Watching a job from a door: await its end, or follow its events, with a deadline.

This is the only module outside the engine that knows how a job's end is signalled: a
:class:`concurrent.futures.Future` per unfinished job, held by the engine's job table
(:meth:`supervisor.jobs.table.JobTable.future`), resolved on the engine loop (and removed)
once the job has ended and its last chunk was published: with the job's final view, or with
:class:`EngineStopped` when the engine stops before the job can end (a journaled job then
waits for the next engine).  When the engine
changes how it says so, only this module changes.

What the doors use:

- :meth:`JobEnd.of` finds a job's end to watch (None: there is none to wait for; the job has
  ended, or the engine does not hold it: :func:`job_view` answers).  Then
  :meth:`JobEnd.when_done` (a callback on the engine loop, once: the control socket),
  :meth:`JobEnd.wait` (awaited on the engine loop: HTTP) or :meth:`JobEnd.result` (blocking,
  from another thread: the facade), each with an optional deadline that raises or hands over
  :class:`JobTimeout` (the job itself goes on).
- :class:`Feed` and :class:`Follow`: one engine subscription for a door, and one job's events
  from it, then its end, as an async iterator with a deadline (the Dynamo bridge).
- :func:`hurry`: take the engine's pending scheduling decision now, for a caller that has
  just submitted and will wait (a hot worker gets the request before the loop turns).
- :func:`abandon`: cancel a job whose watcher went away (an HTTP client that disconnected).

Callbacks and iterators run on the engine loop, as everything that touches the engine does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import EngineStopped, JobTimeout
from ..jobs import JobView

if TYPE_CHECKING:
    from ..engine import Engine
    from ..events import EngineEvent, Subscription

log = logging.getLogger("supervisor.doors")

Outcome = JobView | BaseException  # a job's final view, or why there is none (yet)
Item = tuple[str, Any]  # one thing a Follow yields: ("chunk", bytes), ("job", JobView), ...


def timeout_error(job_id: str, timeout: float | None) -> JobTimeout:
    """What a wait that ran out of time raises: the job goes on."""
    return JobTimeout(f"job {job_id} has not finished after {timeout or 0:g} s "
                      "(it goes on; wait again or cancel it)")


def job_view(engine: Engine, job_id: str) -> JobView:
    """The job as the engine (or its journal) holds it now, its result included: the final
    view of a job with no end to watch (raises :class:`~supervisor.errors.UnknownJob`).  On
    the engine loop."""
    return engine.job_view(job_id)


def answer_head(engine: Engine, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """A running job's backend, and the status and headers its answer began with (200 and
    none until then; "" for the backend of a job the engine has let go)."""
    job = engine.jobs.get(job_id)
    if job is None:
        return "", 200, {}
    return job.backend, job.status_code or 200, dict(job.headers)


def queue_position(engine: Engine, job_id: str) -> int | None:
    """The job's place in the run order while it waits (1 runs next); None otherwise."""
    job = engine.jobs.get(job_id)
    return None if job is None else engine.jobs.position(job)


def live_view(engine: Engine, job_id: str) -> JobView | None:
    """The job as the engine holds it in memory now, chunks so far included; None once the
    engine has let it go.  On the engine loop."""
    job = engine.jobs.get(job_id)
    return None if job is None else engine.jobs.view(job)


def hurry(engine: Engine) -> None:
    """Take the engine's scheduled decision now, not on the loop's next turn: for a caller on
    the engine loop that has just submitted a job and will wait for it (never raises)."""
    engine.step_now()


def abandon(engine: Engine, job_id: str, note: str) -> None:
    """Cancel ``job_id`` quietly, if it has not ended: nobody waits for it any more.  On the
    engine loop; the engine may be stopping, and then there is nothing to do or answer."""
    job = engine.jobs.get(job_id)
    if job is not None and not job.state.finished:
        with contextlib.suppress(Exception):
            engine.cancel(job_id, note=note)


class JobEnd:
    """The end of one unfinished job, to be heard of once."""

    __slots__ = ("engine", "future", "job_id")

    def __init__(self, engine: Engine, job_id: str,
                 future: concurrent.futures.Future[JobView]) -> None:
        self.engine = engine
        self.job_id = job_id
        self.future = future  # resolved on the engine loop

    @classmethod
    def of(cls, engine: Engine, job_id: str) -> JobEnd | None:
        """``job_id``'s end, or None when there is nothing to wait for: it has ended, or the
        engine does not hold it (:func:`job_view` says which).  Safe from any thread."""
        future = engine.jobs.future(job_id)
        return None if future is None else cls(engine, job_id, future)

    def when_done(self, callback: Callable[[Outcome], Any],
                  timeout: float | None = None) -> Watching:
        """Call ``callback`` once, on the engine loop: with the final view when the job ends,
        with :class:`EngineStopped` when the engine stops first, or with :class:`JobTimeout`
        after ``timeout`` seconds.  Call it on the engine loop; :meth:`Watching.cancel` stops
        the watch (no call at all)."""
        return Watching(self, callback, timeout)

    async def wait(self, timeout: float | None = None, *, hurry: bool = False) -> JobView:
        """The final view, awaited on the engine loop (raises :class:`EngineStopped` or
        :class:`JobTimeout`).  ``hurry``: take the engine's decision once the watch is set."""
        waiter: asyncio.Future[JobView] = asyncio.get_running_loop().create_future()

        def settle(outcome: Outcome) -> None:
            if waiter.done():
                return
            if isinstance(outcome, BaseException):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)

        watching = self.when_done(settle, timeout)
        if hurry:
            self.engine.step_now()
        try:
            return await waiter
        finally:
            watching.cancel()

    def result(self, timeout: float | None = None) -> JobView:
        """The final view, blocking this thread (never the engine loop's) until the job ends;
        raises :class:`EngineStopped` or, after ``timeout``, :class:`JobTimeout`."""
        try:
            return self.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise timeout_error(self.job_id, timeout) from None
        except concurrent.futures.CancelledError:
            raise EngineStopped(f"job {self.job_id}: nobody will finish it") from None


def _outcome(future: concurrent.futures.Future[JobView], job_id: str) -> Outcome:
    if future.cancelled():
        return EngineStopped(f"job {job_id}: nobody will finish it")
    error = future.exception()
    return error if error is not None else future.result()


class Watching:
    """One :meth:`JobEnd.when_done`: answers once, on the engine loop, unless cancelled."""

    __slots__ = ("answered", "job_id", "timeout", "_callback", "_loop", "_thread", "_timer")

    def __init__(self, end: JobEnd, callback: Callable[[Outcome], Any],
                 timeout: float | None) -> None:
        loop = end.engine.run.loop
        assert loop is not None, "watch a job on the engine loop"
        self.job_id = end.job_id
        self.timeout = timeout
        self.answered = False
        self._callback = callback
        self._loop = loop
        self._thread = threading.get_ident()  # the engine loop's
        self._timer: asyncio.TimerHandle | None = None
        if timeout is not None:
            self._timer = loop.call_later(max(0.0, timeout), self._expire)
        end.future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[JobView]) -> None:
        if threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens
                self._loop.call_soon_threadsafe(self._done, future)
            return
        if not self.answered:
            self._answer(_outcome(future, self.job_id))

    def _expire(self) -> None:
        if not self.answered:
            self._answer(timeout_error(self.job_id, self.timeout))

    def _answer(self, outcome: Outcome) -> None:
        self.cancel()
        self._callback(outcome)

    def cancel(self) -> None:
        """No answer any more (the watcher went away)."""
        self.answered = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# -- following a job's events ------------------------------------------------------------------


class WatchClosed(EngineStopped):
    """The door stopped watching: the engine's events ended (it stopped), or the door closed."""


class Feed:
    """One door's subscription to the engine's events, handed on to each job's :class:`Follow`.

    A door that follows many jobs at once takes one subscription (not one per job, which would
    offer every event to every follower); each event goes to its job's follower by id.
    ``kinds``: the events followers get besides the end (``chunk``, ``job``); the engine builds
    no event that nobody takes, so a door that needs no ``job`` events should not ask.
    """

    def __init__(self, engine: Engine, kinds: frozenset[str] = frozenset({"chunk"})) -> None:
        self.engine = engine
        self.kinds = kinds
        self.follows: dict[str, Follow] = {}
        self.closed = False
        self._sub: Subscription | None = None

    def start(self) -> None:
        """Subscribe (on the engine loop, once the engine is up)."""
        self._sub = self.engine.events.subscribe(kinds=self.kinds, callback=self._on_event)

    def follow(self, job_id: str, *, timeout: float | None = None) -> Follow:
        """Follow ``job_id`` (on the engine loop, right after submitting it: nothing of the
        job can have happened yet).  Iterate the result; close it when done."""
        return Follow(self, job_id, timeout)

    def _on_event(self, event: EngineEvent) -> None:
        """On the engine loop, inside the engine's publish: hand the event to its follower."""
        try:
            if event.kind == "chunk":
                follow = self.follows.get(event.job_id or "")
                if follow is not None:
                    follow.put(("chunk", event.data))
            elif event.kind == "job" and event.job is not None:
                follow = self.follows.get(event.job.id)
                if follow is not None:
                    follow.put(("job", event.job))
            elif event.kind == "closed":
                self._close_all()
        except Exception:  # noqa: BLE001 - never let a door break the engine's publish
            log.exception("a door could not take an engine event")

    def _close_all(self) -> None:
        for follow in list(self.follows.values()):
            follow.put(("closed", None))
        self.follows.clear()

    def close(self) -> None:
        """Every follower hears that the engine stopped; no more events."""
        self.closed = True
        self._close_all()
        if self._sub is not None:
            self._sub.close()
            self._sub = None


class Follow:
    """One job's events, then its end, in the order the engine made them.

    ``async for kind, value in follow`` yields ``("chunk", bytes)`` and ``("job", JobView)``
    (the kinds its :class:`Feed` takes), then ``("end", JobView)``, the final view, and stops.
    It raises :class:`EngineStopped` when the engine stops before the job can end,
    :class:`WatchClosed` when the feed closes first, and :class:`JobTimeout` past its
    deadline.  :meth:`interrupt` ends the iteration early (the caller's own reason to stop:
    its client went away); :attr:`ended` says whether the job's end (or why it will not come)
    arrived.
    """

    __slots__ = ("ended", "feed", "interrupted", "job_id", "timeout", "_items", "_loop",
                 "_thread", "_timer", "_waiter", "_watching")

    def __init__(self, feed: Feed, job_id: str, timeout: float | None) -> None:
        engine = feed.engine
        loop = engine.run.loop
        assert loop is not None, "follow a job on the engine loop"
        self.feed = feed
        self.job_id = job_id
        self.timeout = timeout
        self.ended = False
        self.interrupted = False
        self._items: deque[Item] = deque()
        self._loop = loop
        self._thread = threading.get_ident()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watching: Watching | None = None
        if feed.closed:
            self._items.append(("closed", None))
            return
        end = JobEnd.of(engine, job_id)
        if end is None:  # it ended already (or is unknown: job_view raises UnknownJob)
            self._items.append(("end", job_view(engine, job_id)))
            return
        feed.follows[job_id] = self
        self._watching = end.when_done(self._on_end)
        if timeout is not None:
            self._timer = loop.call_later(max(0.0, timeout), self.put, ("timeout", None))

    def _on_end(self, outcome: Outcome) -> None:
        self.feed.follows.pop(self.job_id, None)
        if isinstance(outcome, BaseException):
            self.put(("gone", outcome))
        else:
            self.put(("end", outcome))

    def put(self, item: Item) -> None:
        """Queue ``item`` for the iterator; from the engine loop (or, hopping, any thread)."""
        if threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.put, item)
            return
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def interrupt(self) -> None:
        """End the iteration now (what is queued is not read); the job is not touched."""
        self.interrupted = True
        self.put(("stop", None))

    def close(self) -> None:
        """Stop following (the job goes on)."""
        self.feed.follows.pop(self.job_id, None)
        if self._watching is not None:
            self._watching.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __aiter__(self) -> Follow:
        return self

    async def __anext__(self) -> Item:
        if self.interrupted:
            raise StopAsyncIteration
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        kind, value = self._items.popleft()
        if self.interrupted or kind == "stop":
            raise StopAsyncIteration
        if kind == "end":
            self.ended = True
            self.close()
            self._items.append(("stop", None))
        elif kind == "gone":
            self.ended = True
            self.close()
            raise value
        elif kind == "closed":
            self.close()
            raise WatchClosed("the engine stopped")
        elif kind == "timeout":
            self.close()
            raise timeout_error(self.job_id, self.timeout)
        return kind, value
