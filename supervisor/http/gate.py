"""The HTTP door's connection gate: who connected, and how many, before a byte is read.

aiohttp accepts every connection and reads requests from it for as long as the client likes;
on a machine shared with other users that lets anyone hold the engine's file descriptors.  The
gate is aiohttp's own request handler with three things added at the moment a connection is
accepted, before its first byte is read:

- **who it is** (:func:`.peer.identify_socket`): the kernel's answer for the socket, fixed
  for the connection's life, so that a client cannot change what the check sees by closing
  early (the race the old, first-request check lost);
- **how many** each peer holds: open connections, and connections whose request headers have
  not arrived yet, per peer (a local uid, or a remote address) and in total.  Peers other than
  the engine's own user never take the last ``owner_reserve`` slots, so the owner is served
  while another user floods.  A connection over a limit is answered one ``503`` line and
  closed at once: its descriptor is not held;
- **a header deadline**: a request's headers must arrive whole within ``header_timeout_s`` of
  its first byte (of the connection's opening, for the first request), or the connection is
  closed;
- **a body that keeps coming**: until a request's body is whole, ``body_idle_s`` without a
  byte of it (a body shorter than its ``Content-Length``, then silence, held it for good), or
  a body slower than ``body_min_rate`` bytes a second on average past its first
  ``body_idle_s`` (one that dribbles a byte now and then), is answered ``408`` with one line
  saying which, and its connection closed.  Sizes and responses are bounded elsewhere
  (``max_body``, requests in flight).

Every refusal is counted in :meth:`ConnectionGate.stats` and logged, at most once every few
seconds per kind.  :class:`GatedSite` serves an ``AppRunner`` through the gate; the app's
outermost middleware must be :meth:`ConnectionGate.middleware` (it tells the gate when a
request's headers have arrived and when it is answered), and its innermost
:func:`.expect.middleware`: the site holds every request's ``Expect`` back from aiohttp
(:func:`.expect.defer`) for that middleware to answer, after the checks (:mod:`.expect`).
Its connections leave request bodies as they came: :mod:`.bodies` undoes their gzip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from supervisor.clock import monotonic

from . import expect
from .config import GateLimits
from .peer import Peer, identify_socket

log = logging.getLogger("supervisor.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEEPALIVE_TIMEOUT_S = 15.0


class ConnectionGate:
    """Counts and bounds one server's connections; see the module doc."""

    def __init__(self, limits: GateLimits | None = None, owner_uid: int | None = None) -> None:
        self.limits = limits or GateLimits()
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.header_timeout_s = self.limits.header_timeout_s
        self.body_idle_s = self.limits.body_idle_s
        self.body_min_rate = self.limits.body_min_rate
        self.open: Counter[str] = Counter()
        self.pending: Counter[str] = Counter()
        self.counters = {"accepted": 0, "refused": 0, "header_timeouts": 0,
                         "body_timeouts": 0}
        self._logged: dict[str, float] = {}

    # -- admission ----------------------------------------------------------------------------
    def admit(self, peer: Peer) -> str | None:
        """None to let a new connection from ``peer`` in (it is counted), else why not."""
        lim = self.limits
        total = sum(self.open.values())
        key = peer.key
        if total >= lim.max_open:
            why = f"the HTTP door holds {total} connections, its limit"
        elif not peer.is_user(self.owner_uid):
            others = total - sum(n for k, n in self.open.items() if k == self._owner_key)
            if others >= lim.max_open - lim.owner_reserve:
                why = (f"other peers hold {others} connections (the last {lim.owner_reserve} "
                       "are kept for the engine's own user)")
            elif self.open[key] >= lim.max_per_peer:
                why = f"{key} holds {self.open[key]} connections, the limit for one peer"
            elif self.pending[key] >= lim.max_pending_per_peer:
                why = (f"{key} has {self.pending[key]} connections whose request headers "
                       "have not arrived, the limit for one peer")
            else:
                why = None
        else:
            why = None
        if why is not None:
            self.counters["refused"] += 1
            self._warn(key, f"refused an HTTP connection from {peer.describe()}: {why}")
            return why
        self.counters["accepted"] += 1
        self.open[key] += 1
        return None

    @property
    def _owner_key(self) -> str:
        return f"uid {self.owner_uid}"

    def release(self, peer: Peer) -> None:
        self.open[peer.key] -= 1
        if self.open[peer.key] <= 0:
            del self.open[peer.key]

    def waiting(self, peer: Peer, on: bool) -> None:
        """A connection of ``peer`` starts (on) or stops waiting for request headers."""
        key = peer.key
        self.pending[key] += 1 if on else -1
        if self.pending[key] <= 0:
            del self.pending[key]

    def timed_out(self, peer: Peer) -> None:
        self.counters["header_timeouts"] += 1
        self._warn(f"headers {peer.key}", f"closed an HTTP connection from {peer.describe()}: "
                   f"its request headers did not arrive within {self.header_timeout_s:g} s")

    def body_stalled(self, peer: Peer, why: str) -> None:
        self.counters["body_timeouts"] += 1
        self._warn(f"body {peer.key}", f"answered 408 and closed an HTTP connection from "
                   f"{peer.describe()}: its request body {why}")

    def _warn(self, key: str, text: str) -> None:
        now = monotonic()
        if now - self._logged.get(key, -1e9) >= 5.0:
            self._logged[key] = now
            if len(self._logged) > 1024:
                self._logged.clear()
            log.warning("%s", text)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "open": sum(self.open.values()),
                "headers_pending": sum(self.pending.values()), "peers": dict(self.open),
                "max_open": self.limits.max_open, "max_per_peer": self.limits.max_per_peer,
                "header_timeout_s": self.header_timeout_s, "body_idle_s": self.body_idle_s,
                "body_min_rate": self.body_min_rate}

    # -- the middleware ---------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outermost: this request's headers have arrived; the next request's deadline starts
        with its first byte once this one is answered."""
        proto = request.protocol
        gated = proto if isinstance(proto, GatedHandler) else None
        if gated is not None:
            gated.request_started(request.content if request.body_exists else None)
        try:
            return await handler(request)
        finally:
            if gated is not None:
                gated.request_ended()


def refusal_bytes(why: str) -> bytes:
    body = json.dumps({"error": {"message": f"connection refused: {why}; try again shortly",
                                 "type": "unavailable_error", "code": "too_many_connections",
                                 "param": None}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


def body_timeout_bytes(why: str) -> bytes:
    """The ``408`` a request whose body stopped coming (or came too slowly) gets, and then its
    connection closes."""
    body = json.dumps({"error": {"message": f"request timed out: its body {why}; send the "
                                 "whole body (as many bytes as its Content-Length says, or "
                                 "its last chunk) without pausing",
                                 "type": "timeout_error", "code": "body_timeout",
                                 "param": None}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


class GatedHandler(RequestHandler):
    """aiohttp's request handler, identified and counted at accept (see the module doc)."""

    __slots__ = ("gate", "peer", "_admitted", "_in_request", "_deadline", "_waiting",
                 "_body", "_body_timer", "_body_seen", "_body_since")

    def __init__(self, manager: web.Server, gate: ConnectionGate, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.gate = gate
        self.peer: Peer | None = None
        self._admitted = False
        self._in_request = False
        self._waiting = False
        self._deadline: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0  # the body's bytes when the body deadline last looked
        self._body_since = 0.0  # when the request's headers came (its body's clock)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = identify_socket(transport.get_extra_info("socket"))
        self.peer = peer
        why = self.gate.admit(peer)
        if why is not None:
            # (cast: another loop's transports, uvloop's, are not asyncio's subclasses)
            cast(asyncio.WriteTransport, transport).write(refusal_bytes(why))
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._start_waiting()

    def data_received(self, data: bytes) -> None:
        if self._admitted and not self._in_request and not self._waiting:
            self._start_waiting()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._stop_waiting()
        self._stop_body()
        assert self.peer is not None
        self.gate.release(self.peer)
        super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not read (a line over its 8 KiB, a malformed one) answered
        in the door's JSON error shape, its text never echoed back whole (aiohttp's own answer
        is plain text quoting the line); any other error as aiohttp answers it."""
        if not isinstance(exc, HttpProcessingError) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        from ..errors import brief
        from .errors import HttpError

        log.debug("an unreadable HTTP request from %s: %s", request.remote, brief(exc, 200))
        if isinstance(exc, LineTooLong):
            text = (f"the request line or a header is longer than {exc.args[1]} bytes (a path "
                    "parameter that long names nothing here)")
            code = "line_too_long"
        else:
            text = f"the request is not valid HTTP: {brief(exc.message, 200)}"
            code = "bad_http"
        response = HttpError(status if 400 <= status < 500 else 400, text,
                             "invalid_request_error", code).response()
        response.force_close()
        return response

    # -- the header deadline ----------------------------------------------------------------
    def _start_waiting(self) -> None:
        assert self.peer is not None
        self._waiting = True
        self.gate.waiting(self.peer, True)
        self._deadline = asyncio.get_running_loop().call_later(
            self.gate.header_timeout_s, self._headers_late)

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._waiting:
            self._waiting = False
            assert self.peer is not None
            self.gate.waiting(self.peer, False)

    def _headers_late(self) -> None:
        self._deadline = None
        if not self._waiting or self._in_request:
            return
        assert self.peer is not None
        self.gate.timed_out(self.peer)
        self._stop_waiting()
        if self.transport is not None:
            self.transport.close()

    def request_started(self, body: StreamReader | None) -> None:
        self._in_request = True
        self._stop_waiting()
        if body is not None and not body.is_eof():
            self._body = body
            self._body_since = monotonic()
            self._arm_body(body)

    def request_ended(self) -> None:
        self._in_request = False
        self._stop_body()

    # -- the body deadline ------------------------------------------------------------------
    def _arm_body(self, body: StreamReader) -> None:
        self._body_seen = body.total_bytes
        self._body_timer = asyncio.get_running_loop().call_later(
            self.gate.body_idle_s, self._body_check)

    def _stop_body(self) -> None:
        self._body = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_check(self) -> None:
        self._body_timer = None
        body = self._body
        if body is None or body.is_eof():
            self._body = None
            return
        idle, rate = self.gate.body_idle_s, self.gate.body_min_rate
        got = body.total_bytes
        if got == self._body_seen:
            why = f"sent nothing for {idle:g} s"
        elif monotonic() - self._body_since > idle + got / rate:
            why = f"came slower than {rate:g} bytes a second"
        else:  # it came on: look again a period later
            self._arm_body(body)
            return
        assert self.peer is not None
        self.gate.body_stalled(self.peer, why)
        self._body = None
        if self.transport is not None:
            # (no answer has begun: the handler still reads the body, and a route answers
            # only once it has it whole)
            cast(asyncio.WriteTransport, self.transport).write(body_timeout_bytes(why))
            self.transport.close()


class GatedSite(web.SockSite):
    """An ``AppRunner`` served on a bound socket through a :class:`ConnectionGate`."""

    def __init__(self, runner: web.AppRunner, sock: Any, gate: ConnectionGate, *,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT_S) -> None:
        super().__init__(runner, sock)
        self.app = runner.app
        self.gate = gate
        self.keepalive_timeout = keepalive_timeout

    async def start(self) -> None:
        middlewares = list(self.app.middlewares)
        if middlewares[:1] != [self.gate.middleware] or middlewares[-1:] != [expect.middleware]:
            raise TypeError("a gated app's middlewares are the gate's first and "
                            "expect.middleware last")
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        expect.defer(server)  # (before any connection: each takes the request factory)
        loop = asyncio.get_running_loop()

        def factory() -> GatedHandler:
            # A gzip body is unzipped by the door (:mod:`.bodies`), which checks its end:
            # aiohttp's decoding passed on one cut short as if whole.
            return GatedHandler(server, self.gate, loop=loop, access_log=None,
                                keepalive_timeout=self.keepalive_timeout,
                                auto_decompress=False)

        self._server = await loop.create_server(factory, sock=self._sock,
                                                backlog=self._backlog)
