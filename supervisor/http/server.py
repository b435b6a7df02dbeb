"""The HTTP front door: aiohttp on the engine's own loop, a facade service like the control server.

``start`` (on the engine loop, once the engine is up) binds the socket at once — so a port in
use fails the start with a one-line error — and sets aiohttp's ``AppRunner`` going; ``close``
(after the engine stopped) ends every stream and closes the runner.  Routes call the engine's
synchronous, loop-only methods directly, as the control server's methods do; nothing blocks
the loop but for the microseconds those calls take (log files are read in a thread).

Connections come in through the gate (:mod:`.gate`): each is identified and counted when it is
accepted, before a byte is read, and its request headers have a deadline.  Every request then
passes four middlewares, outermost first: errors (everything leaves in the one JSON error
shape; a route that fails once its answer began has its connection cut, as no second answer
can follow the first one's head), the guard (:mod:`.auth`: host, origin, token, peer uid),
limits (requests in flight, like the control socket's connection limit), and
:func:`.expect.middleware`, which says ``100 Continue`` to a client that waits for it only
then (on every path, sub-apps included).  Request bodies are bounded by ``max_body`` (413
past it; at once, before a byte of it is read, when its declared length is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ..errors import VramtuiError
from ..units import bytes_text
from . import expect
from .auth import DECISION, Guard
from .config import HttpConfig, bind_sockets
from .errors import HttpError
from .gate import KEEPALIVE_TIMEOUT_S, ConnectionGate, GatedSite
from .gpu_ids import device_uuids
from .sse import Hub

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("supervisor.http")


class _AnsweredBody(logging.Filter):
    """aiohttp drains what is left of a request's body after its answer; a body that does
    not unzip raises there again, and aiohttp logs it as an unhandled exception with its
    traceback (one a request, any client may send them): answered already, with a 400."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is RequestPayloadError)


logging.getLogger("aiohttp.server").addFilter(_AnsweredBody())

#: The Content-Encodings of a request body the door reads (:mod:`.bodies` undoes gzip, and
#: refuses one cut short).  Not deflate (aiohttp 3.14's decoder waited for ever for the rest
#: of a deflate body cut short, when it decoded them).
BODY_ENCODINGS = frozenset({"", "identity", "gzip"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SHUTDOWN_TIMEOUT_S = 3.0


#: The response a request's route began (its head prepared): set by :func:`_note_started`.
STARTED = web.RequestKey("started", web.StreamResponse)


async def _note_started(request: web.Request, response: web.StreamResponse) -> None:
    request[STARTED] = response


def streaming(handler: Handler) -> Handler:
    """Mark a route that holds its response open (SSE, log follow): it takes a stream slot,
    not a request slot."""
    handler.streaming = True  # type: ignore[attr-defined]
    return handler


class HttpServer:
    """Serves one engine over HTTP on ``config.listen``; a facade service."""

    def __init__(self, engine: Engine, config: HttpConfig, *, version: str = "",
                 subapps: dict[str, web.Application] | None = None,
                 on_ready: Callable[[HttpServer], None] | None = None) -> None:
        self.engine = engine
        self.config = config
        self.version = version
        self.subapps = dict(subapps or {})
        self.on_ready = on_ready
        self.guard = Guard(config)
        self.gate = ConnectionGate(config.connections)
        self.hub = Hub(engine)
        self.uuids: dict[int, str] = {}
        self.in_flight = 0
        self.streams = 0
        self.counters = {"requests": 0, "refused": 0, "over_limit": 0}
        self.address: str = config.listen.url()
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self._socks: list[socket.socket] = []
        self._starting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.ready: asyncio.Event | None = None  # set once serving (made in start)
        self._exporter: Any = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Bind now (raises OSError with the reason) and start serving from the loop."""
        loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        try:
            socks = bind_sockets(self.config.listen)
        except OSError as exc:
            raise VramtuiError(f"the HTTP front door cannot listen on "
                               f"{self.config.listen.url()}: {exc.strerror or exc}") from None
        self._socks = socks
        if self.config.listen.path is None:
            host, port = socks[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            self.address = f"http://{shown}:{port}"
        self.app = self._make_app()
        self._starting = loop.create_task(self._serve(socks))
        log.info("HTTP front door on %s%s", self.address,
                 f" (bearer token from {self.config.token_source})" if self.config.token
                 else " (no token: this user only, over loopback)")

    async def _serve(self, socks: list[socket.socket]) -> None:
        assert self.app is not None
        loop = asyncio.get_running_loop()
        try:
            sources = {i: r.source or self.engine.probe.source
                       for i, r in self.engine.readings.items()}
            self.uuids = await loop.run_in_executor(None, lambda: device_uuids(sources))
        except Exception:  # noqa: BLE001 - the UUID label stays empty
            log.exception("cannot read the GPUs' UUIDs")
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                               handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                               keepalive_timeout=KEEPALIVE_TIMEOUT_S)
        await runner.setup()
        self._runner = runner
        for sock in socks:  # its address, and localhost's other one (bind_sockets)
            await GatedSite(runner, sock, self.gate).start()
        assert self.ready is not None
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready(self)

    async def close(self) -> None:
        self.hub.close()
        if self._starting is not None:
            with contextlib.suppress(BaseException):
                await self._starting
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for sock in self._socks:
            sock.close()
        self._socks = []
        path = self.config.listen.path
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the application ----------------------------------------------------------------------
    def _make_app(self) -> web.Application:
        from . import llama_swap_routes, ollama_routes, openai_routes, routes

        app = web.Application(client_max_size=self.config.max_body,
                              middlewares=[self.gate.middleware, self._errors, self._guard,
                                           self._limits, expect.middleware])
        app.on_response_prepare.append(_note_started)
        routes.add_routes(app, self)
        openai_routes.add_routes(app, self)
        ollama_routes.add_routes(app, self)
        llama_swap_routes.add_routes(app, self)
        for prefix, sub in self.subapps.items():
            app.add_subapp(prefix, sub)
        return app

    @property
    def exporter(self) -> Any:
        if self._exporter is None:
            from .metrics import Exporter

            self._exporter = Exporter(self.engine, self.version, self.uuids)
        self._exporter.collector.uuids = self.uuids
        return self._exporter

    def _declared_too_large(self, request: web.Request) -> bool:
        """Its declared length is over ``max_body``: refused on its word (read to the limit
        first, each such request held ``max_body`` here)."""
        declared = request.content_length
        return declared is not None and declared > self.config.max_body

    @staticmethod
    def _unreadable_encoding(request: web.Request) -> HttpError | None:
        """A body in an encoding the door does not undo (``BODY_ENCODINGS``): refused before
        a byte of it is read.  Every ``Content-Encoding`` header counts (RFC 9110: they are
        one list): the door reads the first, and a gzip body behind an ``identity`` went on
        to a model server still zipped."""
        encoding = ", ".join(request.headers.getall("Content-Encoding", ())).strip().lower()
        if encoding in BODY_ENCODINGS or not request.body_exists:
            return None
        return HttpError(415, f"Content-Encoding {encoding[:40]!r} is not taken: send the body "
                         "as it is, or gzip it", "invalid_request_error",
                         "unsupported_content_encoding")

    def _too_large(self) -> HttpError:
        limit = self.config.max_body
        return HttpError(413, f"request body too large: the limit is {bytes_text(limit)} "
                         f"({limit} bytes); raise http.max_body if you must",
                         "invalid_request_error", "body_too_large")

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # (a redirect: aiohttp answers it)
            failure: Exception = exc
        except Exception as exc:  # noqa: BLE001 - one bad request must not hurt the engine
            failure = exc
        try:
            started = request.get(STARTED)
            if started is None:
                return self._error_response(request, failure)
            # Its head (and some of its body) went already: no other answer can follow it.
            # The route should have ended its stream with an error in the stream's own
            # format; it failed instead, so the connection is cut: the client reads a broken
            # answer, never a whole one (nor a second head inside the first one's body).
            log.error("HTTP %s %s failed after its answer began: %s: %s", request.method,
                      request.path, type(failure).__name__, failure,
                      exc_info=failure if not isinstance(failure, HttpError) else None)
            if request.transport is not None:
                request.transport.close()
            return started
        finally:
            # (its traceback holds this frame, which holds it: a cycle that kept what the
            # route had read, a refused body's megabytes, until a full collection)
            del failure

    def _error_response(self, request: web.Request, exc: Exception) -> web.Response:
        """The answer to a request whose route raised ``exc`` before it began one."""
        if isinstance(exc, HttpError):
            return exc.response_for(request)
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            return self._too_large().response_for(request)
        if isinstance(exc, web.HTTPException):
            kind = {404: "not_found_error", 405: "invalid_request_error"}.get(
                exc.status, "invalid_request_error")
            text = exc.text if exc.text and not exc.text.startswith(str(exc.status)) \
                else exc.reason
            if exc.status == 404:
                text = f"no route {request.method} {request.path}; see GET /v1 for the list"
            elif exc.status == 405:
                allowed = exc.headers.get("Allow", "")
                text = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
            return HttpError(exc.status, text, kind, code=exc.reason.lower().replace(" ", "_"),
                             headers={k: v for k, v in exc.headers.items()
                                      if k.lower() == "allow"}).response_for(request)
        if isinstance(exc, RequestPayloadError):  # (a gzip body that does not unzip, cut short)
            return HttpError(400, f"the request body cannot be read: {exc}"[:300],
                             "invalid_request_error", "unreadable_body").response_for(request)
        log.error("HTTP %s %s failed", request.method, request.path, exc_info=exc)
        return HttpError(500, f"internal error: {type(exc).__name__}: {exc}",
                         "internal_error").response_for(request)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            request[DECISION] = self.guard.check(request)
        except HttpError:
            self.counters["refused"] += 1
            raise
        return await handler(request)

    @web.middleware
    async def _limits(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.counters["requests"] += 1
        if self._declared_too_large(request):
            raise self._too_large()
        if (refused := self._unreadable_encoding(request)) is not None:
            raise refused
        route_handler = getattr(request.match_info, "handler", None)
        is_stream = bool(getattr(route_handler, "streaming", False))
        if is_stream:
            if self.streams >= self.config.max_streams:
                self.counters["over_limit"] += 1
                raise HttpError(503, f"too many open streams ({self.streams}, the limit); "
                                "close some and try again", "unavailable_error",
                                "too_many_streams", headers={"Retry-After": "5"})
            self.streams += 1
        else:
            if self.in_flight >= self.config.max_connections:
                self.counters["over_limit"] += 1
                raise HttpError(503, f"too many requests in flight ({self.in_flight}, the "
                                "limit); try again shortly", "unavailable_error",
                                "too_many_requests", headers={"Retry-After": "1"})
            self.in_flight += 1
        try:
            return await handler(request)
        finally:
            if is_stream:
                self.streams -= 1
            else:
                self.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "in_flight": self.in_flight, "streams": self.streams,
                "sse_dropped": self.hub.dropped, "event_seq": self.hub.seq,
                "connections": self.gate.stats(),
                "address": self.address, "at": time.time()}
