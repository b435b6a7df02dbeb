"""The least a Python proxy in front of a model server costs: the floor under the engine's figures.

``bench/model_server.py`` runs this beside the engine: an aiohttp server on uvloop that
passes ``POST /v1/chat/completions`` to one upstream server over a kept-alive connection
with httptools (the libraries the engine's HTTP door and its forwarding use), and the
answer back, streamed chunk by chunk when it is an event stream. No admission, no job, no
check: what it adds to a direct call is the hop itself on this machine (two more socket
writes and wake-ups, aiohttp's request handling, httptools' parsing), and what the engine
adds beyond it is the cost of everything else. Not a product: a bench's reference; never
run by tests.

    python bench/proxy_floor.py UPSTREAM_PORT LISTEN_PORT
"""

# ruff: noqa: E402  (the path is fixed before the imports: see below)
from __future__ import annotations

import os
import sys

# bench/http.py is beside this file: keep the folder off the path so `http` is the stdlib's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import asyncio

import httptools
from aiohttp import web

try:
    import uvloop
except ImportError:  # (the engine falls back to asyncio's loop too)
    uvloop = None

_END = object()


class _Upstream(asyncio.Protocol):
    """One connection to the server; the answer under way goes to ``events``: its head
    (status, content type), then each piece of its body, then ``_END`` (None: the connection
    closed first)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self.parser = httptools.HttpResponseParser(self)
        self.kind = b"application/json"
        self.keep = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.kind = value

    def on_headers_complete(self) -> None:
        self.events.put_nowait((self.parser.get_status_code(), self.kind.decode()))

    def on_body(self, body: bytes) -> None:
        self.events.put_nowait(bytes(body))

    def on_message_complete(self) -> None:
        self.keep = self.parser.should_keep_alive()
        self.events.put_nowait(_END)

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.put_nowait(None)


class Floor:
    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[_Upstream] = []
        self._spares: set[asyncio.Future[None]] = set()

    async def _connection(self) -> _Upstream:
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        _t, conn = await loop.create_connection(_Upstream, "127.0.0.1", self.port)
        return conn

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        conn = await self._connection()
        assert conn.transport is not None
        conn.transport.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
                             b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                                 request.path.encode(), self.port, len(body), body))
        answer = await conn.events.get()
        if not isinstance(answer, tuple):
            raise web.HTTPBadGateway()
        status, kind = answer
        if "event-stream" not in kind:
            parts = []
            while isinstance(event := await conn.events.get(), bytes):
                parts.append(event)
            self._done(conn, event is _END)
            return web.Response(status=status, body=b"".join(parts),
                                content_type=kind.split(";")[0])
        response = web.StreamResponse(status=status, headers={"Content-Type": kind})
        await response.prepare(request)
        while isinstance(event := await conn.events.get(), bytes):
            await response.write(event)
        self._done(conn, event is _END)
        await response.write_eof()
        return response

    def _done(self, conn: _Upstream, whole: bool) -> None:
        """Kept for the next request when both sides can go on; else closed, and another
        opened for the next request (as the engine does for a server that closes after each
        stream, llama-server: the next request does not wait for a connect)."""
        if whole and conn.keep:
            conn.parser = httptools.HttpResponseParser(conn)
            conn.events = asyncio.Queue()
            self.idle.append(conn)
            return
        if conn.transport is not None:
            conn.transport.close()
        if not self.idle:
            self._spares.add(task := asyncio.ensure_future(self._spare()))
            task.add_done_callback(self._spares.discard)

    async def _spare(self) -> None:
        loop = asyncio.get_running_loop()
        _t, conn = await loop.create_connection(_Upstream, "127.0.0.1", self.port)
        self.idle.append(conn)


def main() -> None:
    upstream, listen = int(sys.argv[1]), int(sys.argv[2])
    app = web.Application()
    app.router.add_post("/v1/chat/completions", Floor(upstream).handle)
    loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=listen, print=None, access_log=None,
                handle_signals=True, loop=loop)


if __name__ == "__main__":
    main()
