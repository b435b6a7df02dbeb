"""The HTTP/1.1 connections from the engine to one model server, kept short on latency.

A job's request to its server is one exchange on one connection (:class:`Link.exchange`):
the request is written in one ``send`` (head and body together) on a kept-alive connection
when one is idle, else on a new one; its answer is parsed as it arrives and handed to a
:class:`Sink` from the connection's own ``data_received``, so a chunk the server writes is
with the engine's observer in the same turn of the loop, not one task switch later. A
connection is kept for the next request when its answer was framed (a length, or chunked),
read whole, and neither side said ``Connection: close``. A server that closes each
connection after a streamed answer (llama-server does) gets a spare connection opened once
that answer ends, so the next request does not wait for a connect; an idle spare the server
closes is not replaced. A kept-alive connection that the server closed just as it was
reused (nothing of an answer came) is tried once more on a new one.

Bounded: an answer's head may be at most :data:`MAX_HEAD` bytes, a chunk-size line
:data:`MAX_LINE`; the body's size is the sink's to bound (it may stop the exchange).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Mapping
from typing import Protocol

from yarl import URL

from .request import target_url

MAX_HEAD = 64 * 1024  # bytes of an answer's status line and headers
MAX_LINE = 4096  # bytes of a chunk-size line or a trailer line
CONNECT_TIMEOUT_S = 10.0
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE", "CONNECT"})


class WireError(ConnectionError):
    """The server's answer broke HTTP/1.1, or its connection went before the answer ended."""


class Sink(Protocol):
    """Where one exchange's answer goes; called on the loop, from ``data_received``."""

    def head(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    def data(self, data: bytes) -> bool:
        """A piece of the body (its framing removed); False: stop, the connection closes."""
        ...


def request_bytes(method: str, target: str, authority: str, headers: Mapping[str, str],
                  body: bytes) -> bytes:
    """One request, head and body, as it goes on the wire."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
    given = {k.lower() for k in headers}
    for key, value in headers.items():
        if key.lower() not in ("host", "content-length", "transfer-encoding"):
            lines.append(f"{key}: {value}")
    if "accept" not in given:
        lines.append("Accept: */*")
    if body or method not in _NO_BODY_METHODS:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body


class _Answer:
    """The parser of one answer: head, then the body by its framing."""

    __slots__ = ("sink", "head_only", "state", "buf", "left", "keep", "status", "got_any")

    def __init__(self, sink: Sink, head_only: bool) -> None:
        self.sink = sink
        self.head_only = head_only  # a HEAD request: no body whatever the headers say
        self.state = "head"  # head, length, size, chunk, crlf, trailer, eof, done
        self.buf = bytearray()
        self.left = 0
        self.keep = False
        self.status = 0
        self.got_any = False

    def feed(self, data: bytes) -> bool:
        """Take bytes; False when the sink said stop. Raises :class:`WireError`."""
        self.got_any = True
        if self.state == "eof":
            return self.sink.data(data)
        if self.state == "length" and not self.buf:
            return self._length(memoryview(data))
        self.buf += data
        return self._run()

    def _run(self) -> bool:
        while self.buf and self.state != "done":
            state = self.state
            if state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_HEAD:
                        raise WireError(f"its answer's head passed {MAX_HEAD} bytes")
                    return True
                raw = bytes(self.buf[:end])
                del self.buf[:end + 4]
                self._head(raw)
            elif state == "length":
                data, self.buf = bytes(self.buf), bytearray()
                return self._length(memoryview(data))
            elif state in ("size", "trailer", "crlf"):
                end = self.buf.find(b"\r\n")
                if end < 0:
                    if len(self.buf) > MAX_LINE:
                        raise WireError("a chunk-size line of its answer is too long")
                    return True
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                self._line(state, line)
            elif state == "chunk":
                n = min(self.left, len(self.buf))
                data = bytes(self.buf[:n])
                del self.buf[:n]
                self.left -= n
                if self.left == 0:
                    self.state = "crlf"
                if not self.sink.data(data):
                    return False
            elif state == "eof":
                data, self.buf = bytes(self.buf), bytearray()
                return self.sink.data(data)
        return True

    def _length(self, view: memoryview) -> bool:
        n = min(self.left, len(view))
        if n < len(view):
            self.keep = False  # more than it said: the connection is not trusted again
            self.buf = bytearray(view[n:])
        self.left -= n
        if self.left == 0:
            self.state = "done"
        return self.sink.data(bytes(view[:n])) if n else True

    def _line(self, state: str, line: bytes) -> None:
        if state == "crlf":
            if line:
                raise WireError("a chunk of its answer did not end with CRLF")
            self.state = "size"
        elif state == "size":
            text = line.split(b";", 1)[0].strip()
            try:
                size = int(text, 16)
            except ValueError:
                raise WireError(f"bad chunk size {text[:20]!r} in its answer") from None
            if size < 0 or len(text) > 16:
                raise WireError(f"bad chunk size {text[:20]!r} in its answer")
            self.left = size
            self.state = "chunk" if size else "trailer"
        elif not line:  # the blank line after the trailers
            self.state = "done"

    def _head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() \
                or len(parts[1]) != 3:
            raise WireError(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
        status = int(parts[1])
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise WireError(f"a malformed header line in its answer: {line[:60]!r}")
            headers.append((name, value.strip()))
        if 100 <= status < 200:
            if status == 101:
                raise WireError("it switched protocols (101) on a plain request")
            return  # an interim answer (100 Continue): the real head follows
        self.status = status
        low = {k.lower(): v for k, v in headers}
        tokens = {t.strip().lower() for t in low.get("connection", "").split(",")}
        self.keep = parts[0] == "HTTP/1.1" and "close" not in tokens
        coding = low.get("transfer-encoding")
        if status == 204 and (coding is not None or low.get("content-length", "0") != "0"):
            # (RFC 9110 §8.6: never; its "body" would be read as the next answer)
            raise WireError("it answered 204 (no content) with a body")
        if self.head_only or status in (204, 304):
            self.state = "done"
        elif coding is not None:
            chunked = coding.split(",")[-1].strip().lower() == "chunked"
            self.state = "size" if chunked else "eof"
            self.keep = self.keep and chunked
        elif "content-length" in low:
            text = low["content-length"].strip()
            if not text.isdigit():
                raise WireError(f"bad Content-Length {text[:20]!r} in its answer")
            self.left = int(text)
            self.state = "length" if self.left else "done"
        else:
            self.state = "eof"  # to the end of the connection
            self.keep = False
        self.sink.head(status, headers)

    def closed(self) -> None:
        """The connection ended: fine only for an answer delimited by it."""
        if self.state == "eof":
            self.state = "done"
        elif self.state != "done":
            raise WireError("the server closed the connection before its answer ended")


class _Connection(asyncio.Protocol):
    """One TCP connection to the server, with at most one exchange on it at a time."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.answer: _Answer | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = False
        self.reuse = True
        self.sock: socket.socket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sock = transport.get_extra_info("socket")
        self._quickack()

    def _quickack(self) -> None:
        """ACK what arrives at once: a server that leaves Nagle on (llama-server) holds
        its next write until its last is acknowledged, and a delayed ACK costs up to 40 ms
        (Linux clears the flag as it goes, so it is set again at each read)."""
        if QUICKACK is not None and self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)

    def start(self, payload: bytes, sink: Sink, head_only: bool, reuse: bool
              ) -> asyncio.Future[None]:
        assert self.transport is not None and self.answer is None
        self.answer = _Answer(sink, head_only)
        self.reuse = reuse
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        self._quickack()  # (a write makes Linux delay its next ACK again: undone)
        return self.done

    def data_received(self, data: bytes) -> None:
        self._quickack()
        answer = self.answer
        if answer is None:  # nothing asked: the server is out of step
            self.abort()
            return
        try:
            go_on = answer.feed(data)
        except WireError as exc:
            self._end(exc)
            self.abort()
            return
        if not go_on:
            self._end(None)
            self.abort()
        elif answer.state == "done":
            keep = answer.keep and not answer.buf and self.reuse
            self._end(None)
            if keep:
                self.link.idle(self)
            else:
                self.abort()
                self.link.spare()

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.link.forget(self)
        answer = self.answer
        if answer is None:
            return
        try:
            answer.closed()
            self._end(None)
        except WireError as err:
            self._end(err if answer.got_any else _Unanswered(str(err)))
        if answer.state == "done":
            self.link.spare()

    def _end(self, error: BaseException | None) -> None:
        done, self.done, self.answer = self.done, None, None
        if done is not None and not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    def abort(self) -> None:
        """Close at once (a cancelled exchange: the server sees its client go)."""
        self.answer = None
        if self.transport is not None:
            self.transport.abort()


class _Unanswered(WireError):
    """The connection ended before any byte of an answer: the request may be tried again."""


class Exchange:
    """One request under way: written at once when a connection was idle (:meth:`Link.begin`),
    else once one is open (:meth:`Link.complete`)."""

    __slots__ = ("payload", "sink", "head_only", "reuse", "conn", "done", "reused",
                 "running", "cancelled", "error")

    def __init__(self, payload: bytes, sink: Sink, head_only: bool, reuse: bool) -> None:
        self.payload = payload
        self.sink = sink
        self.head_only = head_only
        self.reuse = reuse  # False: its connection is closed after the answer
        self.conn: _Connection | None = None
        self.done: asyncio.Future[None] | None = None
        self.reused = False
        self.running = False  # complete() has begun
        self.cancelled = False
        self.error: WireError | None = None  # it could not even be written

    def write(self, conn: _Connection, reused: bool) -> None:
        self.conn, self.reused = conn, reused
        self.done = conn.start(self.payload, self.sink, self.head_only, self.reuse)

    def cancel(self) -> None:
        """Give it up: its connection closes (the server sees its client go)."""
        self.cancelled = True
        if self.conn is not None:
            self.conn.abort()


class Link:
    """The connections to one server (``url``: its base URL), on the engine loop."""

    def __init__(self, url: str) -> None:
        base = URL(url)
        self.url = url
        self.host = base.host or "127.0.0.1"
        self.port = base.port or (443 if base.scheme == "https" else 80)
        self.tls: ssl.SSLContext | None = ssl.create_default_context() \
            if base.scheme == "https" else None
        self.authority = f"{self.host}:{self.port}" if ":" not in self.host \
            else f"[{self.host}]:{self.port}"
        self._idle: list[_Connection] = []
        self._spare: asyncio.Task[None] | None = None
        self.closed = False

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _transport, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(self), self.host, self.port,
                                   ssl=self.tls), CONNECT_TIMEOUT_S)
        return conn

    def _take(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def begin(self, method: str, path: str, headers: Mapping[str, str], body: bytes,
              sink: Sink, *, reuse: bool = True) -> Exchange:
        """The request, written now if a connection is idle (``reuse``: its connection may
        serve the next request; a server that closes after such an answer gets a spare)."""
        try:
            # A valid request target goes exactly as written; anything else is quoted.
            target = target_url(self.url, path).raw_path_qs
            payload = request_bytes(method, target, self.authority, headers, body)
        except (ValueError, UnicodeError) as exc:  # never raised here: complete() says it
            ex = Exchange(b"", sink, False, False)
            ex.error = WireError(f"the request cannot be written: {exc}")
            return ex
        ex = Exchange(payload, sink, method == "HEAD", reuse)
        conn = self._take()
        if conn is not None:
            ex.write(conn, reused=True)
        return ex

    async def complete(self, ex: Exchange) -> None:
        """Feed the exchange's answer to its sink; returns once the answer ended (raises
        :class:`WireError` or ``OSError`` when it could not be had). Cancelled: the
        connection is closed."""
        ex.running = True
        if ex.error is not None:
            raise ex.error
        try:
            for attempt in (1, 2):
                if ex.done is None:
                    conn = self._take()
                    ex.write(conn or await self._open(), reused=conn is not None)
                assert ex.done is not None
                try:
                    await ex.done
                    return
                except _Unanswered:
                    if not ex.reused or attempt == 2:
                        raise
                    ex.done = None  # a kept-alive connection the server had just closed
        except asyncio.CancelledError:
            ex.cancel()
            raise

    def idle(self, conn: _Connection) -> None:
        if self.closed:
            conn.abort()
        else:
            self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def spare(self) -> None:
        """Open a connection for the next request, unless one is idle or on its way (after
        an answer that ended with its connection, or once the server is ready)."""
        if self.closed or self._idle or self._spare is not None:
            return
        self._spare = asyncio.get_running_loop().create_task(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            conn = await self._open()
        except (OSError, TimeoutError):
            return
        finally:
            self._spare = None
        self.idle(conn)

    def close(self) -> None:
        self.closed = True
        if self._spare is not None:
            self._spare.cancel()
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
