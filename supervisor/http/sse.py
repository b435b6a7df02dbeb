"""Server-sent events that never slow the engine: one hub, numbered events, bounded streams.

:class:`Hub` holds the front door's one subscription to the engine's events.  Each event gets
the next number (the SSE ``id:``, monotonic for the life of the server) and goes into a
bounded ring, so a client that reconnects with ``Last-Event-ID`` is replayed what it missed —
or, when that has left the ring, sent a fresh snapshot instead.  The hub listens only while
it has streams, and for ``LINGER_S`` after a resumable one (numbered: the event feeds) ended,
so that a client that reconnects is replayed; then it lets the subscription go, and a door
that nobody follows costs the engine no event at all (one nobody takes is not even built:
every request is a job, and its events would be built for nobody).  The ring is emptied then;
a client that comes back after that, from before the hole, gets a fresh snapshot.

:class:`Stream` is one client's response.  The engine's callback only appends to the stream's
pending queue (O(1), never blocks); the stream's own task writes.  A stream of one job's
events (``job_id``: an answer streamed to its client) is offered that job's events only, so
an event costs the hub the streams that want it, not every open stream.  A client that does not
read falls behind: once its unsent bytes pass the limit, or its queue is full, its pending
events are dropped, counted, and replaced by one fresh snapshot when it catches up.  A quiet
stream gets a comment every ``heartbeat_s`` so proxies and clients know it is alive (None:
never, and no timer is set while it waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from supervisor.clock import monotonic
from supervisor.units import digits

if TYPE_CHECKING:
    from ..engine import Engine
    from ..events import EngineEvent, Subscription

HUB_KINDS = frozenset({"job", "chunk", "worker", "log", "sleep"})
RING_EVENTS = 4096
RING_BYTES = 16 * 1024 * 1024
MAX_PENDING = 2048
RETRY_MS = 3000
LINGER_S = 60.0  # the hub still listens this long after a resumable stream (20 SSE retries)
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

Encoded = tuple[bytes, bool]  # what to write, and whether the stream ends after it


@dataclass(slots=True)
class Item:
    """One engine event with its number; encodings shared by every stream are cached."""

    id: int
    event: EngineEvent
    size: int
    cache: dict[str, bytes] = field(default_factory=dict)

    def encoded(self, key: str, build: Callable[[Item], bytes]) -> bytes:
        data = self.cache.get(key)
        if data is None:
            data = self.cache[key] = build(self)
        return data


def frame(name: str | None, data: Any, event_id: int | None = None) -> bytes:
    """One SSE message: ``id:``, ``event:`` and a one-line JSON ``data:``."""
    head = (f"id: {event_id}\n" if event_id is not None else "") + (
        f"event: {name}\n" if name else "")
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {text}\n\n".encode()


class Hub:
    """The front door's subscription to the engine, numbering events into a replay ring."""

    def __init__(self, engine: Engine, *, ring_events: int = RING_EVENTS,
                 ring_bytes: int = RING_BYTES, first_id: int | None = None) -> None:
        self.engine = engine
        # Numbers go on from microseconds since the epoch (or ``first_id``): a client that
        # resumes with an id of an earlier run of the server holds one below every number of
        # this run, which has left no ring (a snapshot), never one this run gave other events.
        self.seq = time.time_ns() // 1000 if first_id is None else first_id
        self.ring: deque[Item] = deque()
        self.ring_events = ring_events
        self.ring_bytes = ring_bytes
        self._bytes = 0
        self._all: set[Stream] = set()  # streams offered every event (the /v1/events feed)
        self._by_job: dict[str, set[Stream]] = {}  # streams of one job's events, by its id
        self.closed = False
        self.dropped = 0  # events dropped for slow streams (all streams together)
        self._sub: Subscription | None = None
        self._linger_until = 0.0  # with no stream, it still listens until then

    def _listen(self) -> None:
        if self._sub is None and not self.closed:
            self._sub = self.engine.events.subscribe(
                maxsize=1, kinds=HUB_KINDS | {"closed"}, callback=self._on_event)

    def _let_go(self) -> None:
        """No stream, nor one to resume: stop listening and empty the ring. The number after
        the last event kept stands for those not heard: any ``Last-Event-ID`` before it is
        answered with a snapshot (:meth:`since`)."""
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        self.ring.clear()
        self._bytes = 0
        self.seq += 1

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        self._closed()

    def add(self, stream: Stream) -> None:
        """Offer ``stream`` the events from now on (those of its job, when it has one).  Added
        before the hub listens: an engine that has already closed says so at once, and wakes it."""
        if stream.job_id is None:
            self._all.add(stream)
        else:
            self._by_job.setdefault(stream.job_id, set()).add(stream)
        self._listen()

    def discard(self, stream: Stream) -> None:
        if stream.job_id is None:
            self._all.discard(stream)
        elif group := self._by_job.get(stream.job_id):
            group.discard(stream)
            if not group:
                del self._by_job[stream.job_id]
        if stream.resumable and not stream.finished:  # (its client may come back for more)
            self._linger_until = monotonic() + LINGER_S
        elif not self._all and not self._by_job and monotonic() >= self._linger_until:
            # Nothing to resume: let go now, not at the next event (the engine would build
            # that event, and the next request's job events, for nobody).
            self._let_go()

    @property
    def streams(self) -> list[Stream]:
        """Every stream the hub feeds."""
        return [*self._all, *(s for group in self._by_job.values() for s in group)]

    def _closed(self) -> None:
        self.closed = True
        for stream in self.streams:
            stream.wake.set()

    def _on_event(self, event: EngineEvent) -> None:  # on the engine loop, inside publish
        if event.kind == "closed":
            self._closed()
            return
        if not self._all and not self._by_job and monotonic() >= self._linger_until:
            self._let_go()
            return
        self.seq += 1
        size = 256 + len(event.data or b"")
        item = Item(self.seq, event, size)
        self.ring.append(item)
        self._bytes += size
        while self.ring and (len(self.ring) > self.ring_events or self._bytes > self.ring_bytes):
            self._bytes -= self.ring.popleft().size
        for stream in self._all:
            stream.offer(item)
        if event.job_id is not None and (group := self._by_job.get(event.job_id)):
            for stream in tuple(group):
                stream.offer(item)

    def since(self, last_id: int) -> list[Item] | None:
        """The events after ``last_id``, or None when some of them have left the ring (or it
        is no number this hub gave: one from its future)."""
        if last_id == self.seq:
            return []
        if last_id > self.seq:
            return None
        if not self.ring or self.ring[0].id > last_id + 1:
            return None
        return [item for item in self.ring if item.id > last_id]


class Stream:
    """One SSE response fed by the hub.

    ``wants(item)``: cheap, at offer time; ``encode(item)``: the bytes to write (or None to
    skip) and whether to end; ``on_lag(n, seq)``: what to send instead of ``n`` dropped
    events (a fresh snapshot as of event ``seq``).
    """

    def __init__(self, hub: Hub, request: web.Request, *, wants: Callable[[Item], bool],
                 encode: Callable[[Item], Encoded | None],
                 on_lag: Callable[[int, int], Encoded], heartbeat_s: float | None,
                 buffer_limit: int, max_pending: int = MAX_PENDING,
                 heartbeat: bytes | None = b": heartbeat\n\n",
                 job_id: str | None = None, resumable: bool = False) -> None:
        self.hub = hub
        self.job_id = job_id  # set: only this job's events are offered (``wants`` still sees each)
        self.resumable = resumable  # its events are numbered: its client may resume from one
        self.request = request
        self.wants = wants
        self.encode = encode
        self.on_lag = on_lag
        self.heartbeat_s = heartbeat_s
        self.heartbeat = heartbeat  # None: a format with no comments (NDJSON) stays quiet
        self.buffer_limit = buffer_limit
        self.max_pending = max_pending
        self.pending: deque[Item] = deque()
        self.wake = asyncio.Event()
        self.lagged = 0
        self.lags = 0  # times this stream fell behind
        self.ended = False
        self.finished = False  # it ended because what it streams ended (not the client)
        self.client_gone = False
        self._beat_due = False

    # -- the engine side (sync, never blocks) ---------------------------------------------
    def offer(self, item: Item) -> None:
        if self.ended or not self.wants(item):
            return
        transport = self.request.transport
        if transport is None or transport.is_closing():
            self.ended = self.client_gone = True
            self.wake.set()
            return
        if self.lagged or len(self.pending) >= self.max_pending or \
                transport.get_write_buffer_size() > self.buffer_limit:
            if not self.lagged:
                self.lags += 1
            self.lagged += 1 + len(self.pending)
            self.hub.dropped += 1 + len(self.pending)
            self.pending.clear()
        else:
            self.pending.append(item)
        self.wake.set()

    async def _woken(self) -> bool:
        """Wait for an offer (True) or ``heartbeat_s`` (False).  A timer sets the same event:
        no task per wait (as ``wait_for`` makes), so a chunk is written one turn of the loop
        after it is offered, not three; a stream with no heartbeat sets none."""
        self.wake.clear()
        if self.heartbeat_s is None:
            await self.wake.wait()
            return True
        beat = asyncio.get_running_loop().call_later(self.heartbeat_s, self._beat)
        self._beat_due = False
        try:
            await self.wake.wait()
        finally:
            beat.cancel()
        return not self._beat_due

    def _beat(self) -> None:
        self._beat_due = True
        self.wake.set()

    def replay(self, items: list[Item]) -> None:
        for item in items:
            if self.wants(item):
                self.pending.append(item)
        if len(self.pending) > self.max_pending:
            self.lagged += len(self.pending)
            self.pending.clear()

    # -- the writing side ------------------------------------------------------------------
    async def run(self, response: web.StreamResponse, first: bytes = b"") -> None:
        """Write until the stream ends, the client goes, or the hub closes."""
        self.hub.add(self)
        try:
            if first:
                await response.write(first)
            while not self.ended:
                if self.lagged:
                    n, self.lagged = self.lagged, 0
                    self.pending.clear()
                    data, end = self.on_lag(n, self.hub.seq)
                    await response.write(data)
                    if end:
                        self.finished = True
                        break
                    continue
                if not self.pending:
                    if self.hub.closed:
                        break
                    if not await self._woken() and self.heartbeat is not None:
                        await response.write(self.heartbeat)
                    continue
                batch = bytearray()
                end = False
                while self.pending and not end:
                    enc = self.encode(self.pending.popleft())
                    if enc is not None:
                        batch += enc[0]
                        end = enc[1]
                if batch:
                    await response.write(bytes(batch))
                if end:
                    self.finished = True
                    break
        except (ConnectionError, RuntimeError):
            self.client_gone = True  # aiohttp raises these on a closed transport
        finally:
            self.ended = True
            self.hub.discard(self)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()


def last_event_id(request: web.Request) -> int | None:
    """The ``Last-Event-ID`` a reconnecting client sent (header, or ``?last_event_id=``)."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    if raw is None:
        return None
    raw = raw.strip()
    return int(raw) if digits(raw) and len(raw) < 19 else None


async def open_response(request: web.Request, status: int = 200,
                        headers: dict[str, str] | None = None) -> web.StreamResponse:
    response = web.StreamResponse(status=status, headers={**HEADERS, **(headers or {})})
    await response.prepare(request)
    return response
