"""The HTTP/1.1 connections from the engine to one model server, kept short on latency.

A job's request to its server is one exchange on one connection (:class:`Exchange`):
the request is written in one ``send`` (head and body together) on a kept-alive connection
when one is idle, else on a new one; its answer is parsed as it arrives and handed to a
:class:`Sink` from the connection's own ``data_received``, so a chunk the server writes is
with the engine's observer in the same turn of the loop, not one task switch later. The
request is written here (its method, target and headers checked against HTTP/1.1's
syntax first); the answer is read by httptools (llhttp, Node's HTTP/1.1 parser, in C: a
few microseconds an answer where h11, pure Python, took some sixty, on the path of every
request). It is strict where a hand-written parser is lenient (chunk sizes, conflicting
lengths, header syntax, bare LF, folded headers), and a broken answer ends its exchange with
a one-line :class:`WireError` and its connection. A connection is kept for the next request
when its answer was framed (a length, or chunked), read whole with nothing after it, and
neither side said ``Connection: close``; an answer with both ``Transfer-Encoding`` and
``Content-Length`` (a smuggling attempt), or any transfer coding but ``chunked`` alone, is
broken. A server that closes each
connection after a streamed answer (llama-server does) gets a spare connection opened once
that answer ends, so the next request does not wait for a connect; an idle spare the server
closes is not replaced. A kept-alive connection that the server closed just as it was
reused (nothing of an answer came) is tried once more on a new one.

An exchange whose server sends nothing for the link's ``idle_s`` (``timeouts.idle``: from
the request written to its answer's first byte, then between any two) fails with a
:class:`Silent` error saying so, and its connection closes: a server that hangs mid-answer
while its health check still answers frees its job's slot. The link owns the count of such
silences in a row (:attr:`Silent.in_a_row`), which tells one slow request from a server
whose generation is stuck: a silence counts only when no other exchange's answer moved
during it, and any answer that moves (a piece of a 2xx body, or its end; a head alone is
its HTTP thread's, as ``/health`` is) sets it back to 0.

Bounded: an answer's head (and a chunk-size or trailer line) may be at most
:data:`MAX_HEAD` bytes and :data:`MAX_HEADERS` headers; the body's size is the sink's to
bound (it may stop the exchange).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
import socket
import ssl
from collections.abc import Mapping
from typing import Protocol, cast

import httptools
from yarl import URL

from .request import target_url

MAX_HEAD = 64 * 1024  # bytes of an answer's status line and headers
MAX_HEADERS = 256  # headers of an answer (and as many trailers)
MAX_INTERIM = 32  # interim (1xx) answers before the final one
CONNECT_TIMEOUT_S = 10.0
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
_FRAMING = frozenset({"host", "content-length", "transfer-encoding"})  # ours, never a caller's
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")  # a method or a header's name
_TARGET = re.compile(r"[^\x00-\x20\x7f]+")  # no space, no control
_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[ \t]*[\x21-\x7e\x80-\xff])*)?")


class WireError(ConnectionError):
    """The server's answer broke HTTP/1.1, or its connection went before the answer ended."""


class Silent(WireError):
    """An exchange's server sent nothing for the idle limit (``idle_s``); ``in_a_row``: the
    exchanges of that server silent so in a row, with no answer moving on any exchange
    during their silence nor since (this one included; 0: others' answers moved meanwhile:
    a slow request, not a stuck server)."""

    def __init__(self, idle_s: float, in_a_row: int) -> None:
        super().__init__(f"it sent nothing for {idle_s:g} s (timeouts.idle): hung?")
        self.idle_s = idle_s
        self.in_a_row = in_a_row


class Sink(Protocol):
    """Where one exchange's answer goes; called on the loop, from ``data_received``."""

    def head(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    def data(self, data: bytes) -> bool:
        """A piece of the body (its framing removed); False: stop, the connection closes."""
        ...


class RequestHead:
    """One request's head as it goes on the wire: its request line and header lines."""

    __slots__ = ("method", "lines")

    def __init__(self, method: str, lines: bytes) -> None:
        self.method = method
        self.lines = lines  # the request line and the header lines, ending with the blank one


def request_event(method: str, target: str, authority: str, headers: Mapping[str, str],
                  body: bytes) -> RequestHead:
    """One request's head, checked (``Host`` first, our framing: ``Content-Length`` when it
    has a body or its method may take one). Raises ``ValueError`` for a method, target or
    header HTTP/1.1 cannot carry (RFC 9110's token and field-value syntax)."""
    if not _TOKEN.fullmatch(method):
        raise ValueError(f"{method[:40]!r} is not an HTTP method")
    if not _TARGET.fullmatch(target):
        raise ValueError(f"{target[:80]!r} is not a request target")
    lines = [f"{method} {target} HTTP/1.1\r\n".encode("ascii"),
             _header_line("Host", authority.encode("ascii"))]
    accept = False
    for k, v in headers.items():
        low = k.lower()
        accept = accept or low == "accept"
        if low not in _FRAMING:
            # A value is sent as the bytes the client wrote (the door read them as UTF-8).
            lines.append(_header_line(k, v.encode("utf-8", "surrogateescape")))
    if not accept:
        lines.append(b"Accept: */*\r\n")
    if body or method not in _NO_BODY_METHODS:
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return RequestHead(method, b"".join(lines))


@functools.lru_cache(maxsize=256)  # (most requests of a server repeat most of their headers)
def _header_line(name: str, value: bytes) -> bytes:
    """``name: value``, its line; ``ValueError`` for one HTTP/1.1 cannot carry."""
    value = value.strip(b" \t")
    if not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
        raise ValueError(f"the header {name[:40]!r} cannot be carried by HTTP/1.1")
    return b"%s: %s\r\n" % (name.encode("ascii"), value)


def request_bytes(head: RequestHead, body: bytes) -> bytes:
    """The request as it goes on the wire, head and body (its length the head's)."""
    return head.lines + body


class _Stop(Exception):  # noqa: N818 - not an error: the sink said stop
    """Raised from the parser's body callback when the sink says stop."""


class _Answer:
    """One exchange's answer: the bytes go into its parser (httptools: llhttp, Node's
    strict HTTP/1.1 parser, in C), its events to the sink."""

    __slots__ = ("sink", "parser", "head_only", "headed", "done", "keep", "got_any",
                 "headers", "interim", "interims", "until_close", "quiet", "error", "after",
                 "good", "moved")

    def __init__(self, sink: Sink, method: str) -> None:
        self.sink = sink
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = method == "HEAD"  # its answer has a head alone (RFC 9110 §9.3.2)
        self.headed = False  # its final head came
        self.done = False
        self.keep = True  # the connection may serve the next request once this ends
        self.got_any = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.interim = False  # the head being read is a 1xx's
        self.interims = 0  # 1xx answers so far (each resets ``quiet``: bounded here)
        self.until_close = False  # its body ends with the connection
        self.quiet = 0  # bytes taken since the parser last said something (a head, a chunk)
        self.error: WireError | None = None  # raised in a callback, said by feed
        self.after = False  # something came after the answer
        self.good = False  # its final head is a 2xx's
        self.moved = False  # a piece of a 2xx body, or its end, came (the link is told)

    def feed(self, data: bytes) -> bool:
        """Take bytes (b"": the connection ended); False when the sink said stop. Raises
        :class:`WireError`."""
        if not data:
            if self.headed and self.until_close and not self.done:
                self.done, self.keep = True, False
            return True
        self.got_any = True
        if self.done:  # bytes after the answer: the connection serves no other
            self.keep = False
            return True
        self.quiet += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            # (what a callback raised comes back wrapped: the sink's stop, our WireError,
            # or a fault of ours, raised as it was)
            if isinstance(exc.__context__, _Stop):
                return False
            if self.error is not None:
                raise self.error from None
            raise exc.__context__ or exc from None
        except httptools.HttpParserUpgrade:
            if self.done:  # (a 101 after the answer: bytes after it, like any other)
                self.keep = False
                return True
            raise WireError("it switched protocols (101) on a plain request") from None
        except httptools.HttpParserError as exc:
            if self.done:  # after the answer: the next one's, or garbage
                self.keep = False
                return True
            raise self._broken(exc) from None
        if not self.done and self.quiet > MAX_HEAD:
            part = "head" if not self.headed else "chunk-size or trailer line"
            raise WireError(f"its answer's {part} passed {MAX_HEAD} bytes")
        return True

    def _fail(self, error: WireError) -> None:
        self.error = error
        raise error

    def _broken(self, exc: Exception) -> WireError:
        said = str(exc)[:100]
        if not self.headed and "header" in said.lower():
            return WireError(f"its answer's head has a header HTTP/1.1 cannot carry ({said})")
        if not self.headed:
            return WireError(f"not an HTTP/1.x answer ({said})")
        return WireError(f"its answer's body broke HTTP/1.1 framing ({said})")

    # -- the parser's callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:
            self.after = True
            self.keep = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.done:
            return
        self.headers.append((name, value))
        if len(self.headers) > MAX_HEADERS:
            self._fail(WireError(f"its answer has more than {MAX_HEADERS} headers"))

    def on_headers_complete(self) -> None:
        if self.done:
            return
        self.quiet = 0
        status = self.parser.get_status_code()
        headers, self.headers = self.headers, []
        if not 100 <= status <= 999:
            self._fail(WireError(f"not an HTTP/1.x answer (status {status})"))
        if status < 200:
            if status == 101:
                self._fail(WireError("it switched protocols (101) on a plain request"))
            self.interim = True  # (its end is not the answer's)
            self.interims += 1
            if self.interims > MAX_INTERIM:
                self._fail(WireError(f"it sent more than {MAX_INTERIM} interim (1xx) answers"))
            return
        self.interim = False
        self._head(status, headers)

    def on_body(self, body: bytes) -> None:
        if self.done or self.interim:
            return
        self.quiet = 0
        self.moved = self.good
        if not self.sink.data(bytes(body)):
            raise _Stop

    def on_chunk_header(self) -> None:
        self.quiet = 0

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.done:
            return
        self.done = True
        self.moved = self.good
        self.keep = self.keep and not self.after and self.parser.should_keep_alive()

    def _head(self, status: int, raw: list[tuple[bytes, bytes]]) -> None:
        # (one pass: the answer's head is on every request's path)
        headers: list[tuple[str, str]] = []
        encodings: list[bytes] = []
        size = 0
        length: bytes | None = None
        for name, value in raw:
            size += len(name) + len(value) + 4
            low = name.lower()
            value = value.strip(b" \t")
            if low == b"transfer-encoding":
                encodings.append(value.lower())
            elif low == b"content-length":
                length = value if length is None or length == b"0" else length
            headers.append((name.decode("latin-1"), _text(value)))
        if encodings and encodings != [b"chunked"]:
            self._fail(WireError("its answer's Transfer-Encoding is not chunked alone"))
        if status == 204 and (encodings or (length is not None and length != b"0")):
            # (RFC 9110 §8.6: never; its "body" would be read as the next answer)
            self._fail(WireError("it answered 204 (no content) with a body"))
        if size > MAX_HEAD:
            self._fail(WireError(f"its answer's head passed {MAX_HEAD} bytes"))
        self.headed = True
        self.good = 200 <= status < 300
        # (an HTTP/1.0 answer's keep-alive is an old convention: its connection is not reused)
        self.keep = self.parser.should_keep_alive() and self.parser.get_http_version() == "1.1"
        self.until_close = not (self.head_only or status in (204, 304) or encodings
                                or length is not None)
        self.sink.head(status, headers)
        if self.head_only:  # (a length it gives is the GET's; no body follows)
            self.done, self.keep = True, False


def _text(value: bytes) -> str:
    """A header value as text that the door writes back as the same bytes (it writes
    UTF-8): UTF-8 read as such, anything else (not UTF-8) as Latin-1."""
    if value.isascii():
        return value.decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


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
        self.heard = 0.0  # (loop time) the request written, or the answer's last bytes
        self.loop: asyncio.AbstractEventLoop | None = None  # its time is the idle timer's
        self.watch: asyncio.TimerHandle | None = None  # the idle limit's, while one runs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (cast: another loop's transports, uvloop's, are not asyncio.Transport's subclasses)
        self.transport = cast(asyncio.Transport, transport)
        self.sock = transport.get_extra_info("socket")
        self._quickack()

    def _quickack(self) -> None:
        """ACK what arrives at once: a server that leaves Nagle on (llama-server) holds
        its next write until its last is acknowledged, and a delayed ACK costs up to 40 ms
        (Linux clears the flag as it goes, so it is set again at each read)."""
        if QUICKACK is not None and self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)

    def start(self, payload: bytes, answer: _Answer, reuse: bool) -> asyncio.Future[None]:
        assert self.transport is not None and self.answer is None
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(_seen)
        if self.lost or self.transport.is_closing():
            # (it went between its opening and now: nothing was written, nothing will come;
            # writing on it would be dropped (asyncio) or raise (uvloop))
            done.set_exception(_Unanswered())
            return done
        self.answer = answer
        self.reuse = reuse
        self.done = done
        self.transport.write(payload)
        self._quickack()  # (a write makes Linux delay its next ACK again: undone)
        if self.link.idle_s is not None:
            loop = asyncio.get_running_loop()
            self.loop = loop
            self.heard = loop.time()
            self.watch = loop.call_at(self.heard + self.link.idle_s, self._check_idle)
        return self.done

    def _check_idle(self) -> None:
        """The idle limit's timer (set again for what is left of it when bytes came since:
        one timer an exchange, not one a chunk): silent that long, the exchange fails and
        its connection closes (the server sees its client go, and frees its slot)."""
        self.watch = None
        idle = self.link.idle_s
        if self.answer is None or idle is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self.heard < idle:
            self.watch = loop.call_at(self.heard + idle, self._check_idle)
            return
        self._end(Silent(idle, self.link.went_silent(self.heard)))
        self.abort()

    def data_received(self, data: bytes) -> None:
        self._quickack()
        if self.watch is not None and self.loop is not None:
            self.heard = self.loop.time()
        answer = self.answer
        if answer is None:  # nothing asked: the server is out of step
            self.abort()
            return
        try:
            go_on = answer.feed(data)
        except Exception as exc:  # noqa: BLE001 - WireError, or a fault of ours (a sink's):
            self._end(exc)  # complete() raises it (never the loop's "fatal error" and a
            self.abort()  # misleading "the server closed the connection")
            return
        if answer.moved:
            answer.moved = False
            self.link.moved(self.heard)  # (heard is now's only while an idle limit runs)
        if not go_on:
            self._end(None)
            self.abort()
        elif answer.done:
            # (a server that answered before it read our whole body, a 413 say, may never
            # read the rest: the next request would wait behind it)
            keep = answer.keep and self.reuse and not self.transport.get_write_buffer_size()
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
        if not answer.got_any:  # (its parser untouched: the request may go again as it is)
            self._end(_Unanswered())
            return
        try:
            if exc is not None and answer.until_close and not answer.done:
                # (a reset is no end: the answer was cut, and the kernel may have dropped
                # bytes of it that had come)
                raise WireError(f"the connection broke before its answer ended ({exc})")
            answer.feed(b"")  # an answer delimited by the connection's end ends here
            if not answer.done:
                raise WireError("the server closed the connection before its answer ended")
            self._end(None)
        except WireError as err:
            self._end(err)
        if answer.done:
            self.link.spare()

    def _end(self, error: BaseException | None) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        done, self.done, self.answer = self.done, None, None
        if done is not None and not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    def abort(self) -> None:
        """Close at once (a cancelled exchange: the server sees its client go)."""
        self.answer = None
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        if self.transport is not None:
            self.transport.abort()


def _seen(done: asyncio.Future[None]) -> None:
    """Take an exchange's error as seen: one given up before :meth:`Link.complete` awaited
    it (its job's task cancelled before it ran) would have asyncio log it as never
    retrieved when its connection ends. ``complete`` still raises it."""
    if not done.cancelled():
        done.exception()


class _Unanswered(WireError):
    """The connection ended before any byte of an answer: the request may be tried again."""

    def __init__(self) -> None:
        super().__init__("the server closed the connection before answering")


class Exchange:
    """One request under way: written at once when a connection was idle (:meth:`Link.begin`),
    else once one is open (:meth:`Link.complete`)."""

    __slots__ = ("head", "body", "answer", "reuse", "conn", "done", "reused", "running",
                 "cancelled", "error")

    def __init__(self, head: RequestHead | None, body: bytes, answer: _Answer,
                 reuse: bool) -> None:
        self.head = head  # None: it could not be written (``error`` says why)
        self.body = body
        self.answer = answer
        self.reuse = reuse  # False: its connection is closed after the answer
        self.conn: _Connection | None = None
        self.done: asyncio.Future[None] | None = None
        self.reused = False
        self.running = False  # complete() has begun
        self.cancelled = False
        self.error: WireError | None = None  # it could not even be written

    def write(self, conn: _Connection, reused: bool) -> None:
        assert self.head is not None
        self.conn, self.reused = conn, reused
        self.done = conn.start(request_bytes(self.head, self.body), self.answer, self.reuse)

    def cancel(self) -> None:
        """Give it up: its connection closes (the server sees its client go)."""
        self.cancelled = True
        if self.conn is not None:
            self.conn.abort()


class Link:
    """The connections to one server (``url``: its base URL), on the engine loop."""

    def __init__(self, url: str, idle_s: float | None = None) -> None:
        base = URL(url)
        self.url = url
        self.idle_s = idle_s  # an exchange whose answer is silent this long fails (None: never)
        self.host = base.host or "127.0.0.1"
        self.port = base.port or (443 if base.scheme == "https" else 80)
        self.tls: ssl.SSLContext | None = ssl.create_default_context() \
            if base.scheme == "https" else None
        self.authority = f"{self.host}:{self.port}" if ":" not in self.host \
            else f"[{self.host}]:{self.port}"
        self._idle: list[_Connection] = []
        self._spare: asyncio.Task[None] | None = None
        self.closed = False
        self.moved_at = -math.inf  # (loop time) an answer last moved, on any exchange
        self.silent = 0  # exchanges silent past idle_s in a row, nothing moving (Silent)

    def moved(self, at: float) -> None:
        """An answer moved at ``at`` (loop time): the server generates."""
        self.moved_at = at
        self.silent = 0

    def went_silent(self, since: float) -> int:
        """An exchange silent since ``since`` (loop time) passed the idle limit: how many in
        a row now; 0 when another's answer moved during its silence (one slow request
        among answered ones: the server is not stuck)."""
        self.silent = 0 if self.moved_at > since else self.silent + 1
        return self.silent

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
        answer = _Answer(sink, method)
        try:
            # A valid request target goes exactly as written; anything else is quoted.
            target = target_url(self.url, path).raw_path_qs
            head = request_event(method, target, self.authority, headers, body)
        except (ValueError, UnicodeError) as exc:
            ex = Exchange(None, b"", answer, False)  # never raised here: complete() says it
            ex.error = WireError(f"the request cannot be written: {exc}")
            return ex
        ex = Exchange(head, body, answer, reuse)
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
