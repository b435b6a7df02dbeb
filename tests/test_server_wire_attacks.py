"""A hostile model server against the engine's HTTP/1.1 connections (supervisor/servers/wire.py).

Each case is a real TCP server on loopback, in process, that answers a job's request with
exactly the bytes an attacker (or a badly broken server) would send, then answers a second
request correctly on whichever connection it comes.  The first job must end cleanly (its
answer, or a one-line :class:`WireError`), nothing may hang or log a traceback, and the
second job must get its own answer, never bytes of the first, on a fresh connection
whenever the first answer left the connection in doubt.  No process is started.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Coroutine

import pytest
from test_server_wire import Scripted, Sink, ask, run
from waiting import wait_until_async

from supervisor.servers.wire import MAX_HEAD, MAX_INTERIM, Link, WireError

OK = b"HTTP/1.1 200 OK\r\n"
SECOND = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"
FORGED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
ERROR, HANG = "error", "hang"

# (name, method, answer, outcome): outcome is ERROR, or (status, body, connection reused)
CASES: list[tuple[str, str, bytes, object]] = [
    # smuggling and desync on a kept-alive connection
    # (RFC 9112 §6.3: both "ought to be handled as an error")
    ("te-and-cl", "POST", OK + b"Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n"
     b"2\r\nok\r\n0\r\n\r\n", ERROR),
    ("conflicting-cl", "POST", OK + b"Content-Length: 2\r\nContent-Length: 42\r\n\r\nok"
     + FORGED, ERROR),
    ("cl-list-conflict", "POST", OK + b"Content-Length: 2, 42\r\n\r\nok" + FORGED, ERROR),
    ("te-chunked-identity", "POST", OK + b"Transfer-Encoding: chunked, identity\r\n\r\n"
     b"2\r\nok\r\n0\r\n\r\n", ERROR),
    ("te-twice", "POST", OK + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n"
     b"\r\n2\r\nok\r\n0\r\n\r\n", ERROR),
    ("chunk-size-plus", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n+2\r\nok\r\n0\r\n\r\n",
     ERROR),
    ("chunk-size-0x", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\n",
     ERROR),
    ("chunk-size-underscore", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n"
     b"1_0\r\n0123456789abcdef\r\n0\r\n\r\n", ERROR),
    ("chunk-size-space", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n 2\r\nok\r\n0\r\n\r\n",
     ERROR),
    ("chunk-size-superscript", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n\xb2\r\nok\r\n"
     b"0\r\n\r\n", ERROR),
    # (a chunk size past 64 bits: broken, never read as a smaller one)
    ("chunk-size-overflow", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n"
     b"ffffffffffffffffff\r\nok\r\n0\r\n\r\n", ERROR),
    ("chunk-extension", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n2;a=b;c=\"d\"\r\nok\r\n"
     b"0\r\n\r\n", (200, b"ok", True)),
    ("chunk-no-crlf", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n",
     ERROR),
    ("bytes-after-length", "POST", OK + b"Content-Length: 2\r\n\r\nok" + FORGED,
     (200, b"ok", False)),
    ("bytes-after-chunked", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n"
     b"0\r\n\r\n" + FORGED, (200, b"ok", False)),
    # heads
    # (llhttp is strict: a bare LF, or a header folded over two lines (RFC 9112 §5.2: obsolete),
    # is read as the broken answer it is, not guessed at)
    ("bare-lf-head", "POST", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", ERROR),
    ("obs-fold", "POST", OK + b"X-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok", ERROR),
    ("obs-fold-length", "POST", OK + b"Content-Length: 2\r\n 0\r\n\r\nok", ERROR),
    ("header-name-space", "POST", OK + b"Content Length: 2\r\n\r\nok", ERROR),
    ("header-name-space-before-colon", "POST", OK + b"Content-Length : 2\r\n\r\nok", ERROR),
    ("header-name-control", "POST", OK + b"Content-Length: 2\r\nX\x01Y: 1\r\n\r\nok", ERROR),
    ("header-value-nul", "POST", OK + b"Content-Length: 2\r\nX: a\x00b\r\n\r\nok", ERROR),
    ("early-hints-then-answer", "POST", b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
     b"HTTP/1.1 100 Continue\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\nok", (200, b"ok", True)),
    ("endless-interims", "POST", b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INTERIM + 1)
     + OK + b"Content-Length: 2\r\n\r\nok", ERROR),
    # (a 101 after the whole answer is bytes after it like any other: the answer stands)
    ("answer-then-101", "POST", OK + b"Content-Length: 2\r\n\r\nok"
     b"HTTP/1.1 101 SP\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", (200, b"ok", False)),
    ("switching-protocols", "POST", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"
     + FORGED, ERROR),
    ("status-superscript", "POST", b"HTTP/1.1 \xb2\xb2\xb2 OK\r\nContent-Length: 2\r\n\r\nok",
     ERROR),
    ("status-000", "POST", b"HTTP/1.1 000 OK\r\nContent-Length: 2\r\n\r\nok", ERROR),
    ("status-099", "POST", b"HTTP/1.1 099 OK\r\nContent-Length: 2\r\n\r\nok", ERROR),
    ("status-line-garbage", "POST", b"HTTP/1.1 200OK\r\nContent-Length: 2\r\n\r\nok", ERROR),
    ("http2-preface", "POST", b"HTTP/2 200\r\nContent-Length: 2\r\n\r\nok", ERROR),
    ("cl-superscript", "POST", OK + b"Content-Length: \xb2\r\n\r\nok", ERROR),
    ("http10-keep-alive", "POST", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n"
     b"Connection: keep-alive\r\n\r\nok", (200, b"ok", False)),
    ("head-with-body", "HEAD", OK + b"Content-Length: 6\r\n\r\nforged", (200, b"", False)),
    ("304-with-body", "GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\r\nforged",
     (304, b"", False)),
    ("many-small-headers", "POST", OK + b"X: a\r\n" * (MAX_HEAD // 6 + 10)
     + b"Content-Length: 2\r\n\r\nok", ERROR),
    ("head-never-ends", "POST", OK + b"X: " + b"a" * (MAX_HEAD + 10), ERROR),
    ("closed-mid-chunk", "POST", OK + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhel", ERROR),
]


def run_logging_no_error(coro: Coroutine[None, None, None],
                         caplog: pytest.LogCaptureFixture) -> None:
    """``run``, and no error logged meanwhile (a traceback, the loop's "fatal error")."""
    with caplog.at_level(logging.ERROR):
        run(coro)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "an error logged"


@pytest.mark.parametrize(("method", "answer", "outcome"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_a_hostile_answer_ends_its_job_cleanly_and_never_reaches_the_next(
        method: str, answer: bytes, outcome: object, caplog: pytest.LogCaptureFixture) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        first = True
        while await srv.read_request(reader) is not None:
            writer.write(answer if i == 0 and first else SECOND)
            await writer.drain()
            if i == 0 and first and outcome == ERROR:
                return  # (closes: a job that waited for more sees it end)
            first = False

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            sink = Sink()
            try:
                await asyncio.wait_for(
                    link.complete(link.begin(method, "/a", {}, b"" if method != "POST" else b"{}",
                                             sink)), 3)
                got: object = (sink.status, sink.body, None)
            except WireError as exc:
                assert "\n" not in str(exc) and str(exc)
                got = ERROR
            except TimeoutError:
                got = HANG
            if outcome == ERROR:
                assert got == ERROR
            else:
                assert isinstance(outcome, tuple)
                assert got == (outcome[0], outcome[1], None)
            second = Sink()
            await ask(link, second)
            assert (second.status, second.body) == (200, b"second")  # never the first's bytes
            if outcome != ERROR:
                assert isinstance(outcome, tuple)
                assert (srv.connections == 1) == outcome[2], "reused a connection in doubt"
            link.close()

    srv: Scripted
    run_logging_no_error(main(), caplog)


def test_bytes_on_an_idle_connection_drop_it_before_the_next_job_can_read_them() -> None:
    """A server that writes after its answer ended: whether the bytes come with the answer
    or once the connection is idle, that connection is closed, never handed to the next job
    (bytes that come only after the next request was written are its answer: HTTP/1.1
    cannot tell them apart)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is None:
            return
        if i == 0:
            writer.write(OK + b"Content-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.write(FORGED)
            await writer.drain()
            await srv.read_request(reader)  # the client goes: None
        else:
            writer.write(SECOND)
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            sink = Sink()
            await link.complete(link.begin("POST", "/a", {}, b"{}", sink))
            assert sink.body == b"ok"
            await asyncio.wait_for(srv.closed_by_client.wait(), 3)
            second = Sink()
            await link.complete(link.begin("POST", "/b", {}, b"{}", second))
            assert second.body == b"second" and srv.connections >= 2  # (a spare, maybe)
            link.close()

    srv: Scripted
    run(main())


def test_a_connection_the_server_closed_before_the_request_was_written_fails_at_once() -> None:
    """A server that accepts and closes at once (at its connection limit, shutting down):
    when the close is read before the request is written, the request fails with a one-line
    error, never written on a dead transport and waited for forever (asyncio drops the write;
    uvloop raises)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        return  # (closed at once)

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            opened = Link._open

            async def open_then_lose(self: Link):  # noqa: ANN202 - the close is read first
                conn = await opened(self)
                await wait_until_async(lambda: conn.lost, 5, "the close read")
                return conn

            link._open = open_then_lose.__get__(link)  # type: ignore[method-assign]
            with pytest.raises(WireError, match="closed the connection before answering"):
                await ask(link, Sink(), "/a")
            link.close()

    srv: Scripted
    run(main())


def test_a_sinks_own_fault_is_raised_by_complete_not_blamed_on_the_server(
        caplog: pytest.LogCaptureFixture) -> None:
    """An exception of ours in a sink is a bug of ours: ``complete`` raises it as it was
    (so the engine says so), the loop logs no "fatal error", and the server is not said to
    have closed the connection."""

    class Faulty(Sink):
        def data(self, data: bytes) -> bool:
            raise RuntimeError("a sink's own fault")

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(SECOND)
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            with pytest.raises(RuntimeError, match="a sink's own fault"):
                await ask(link, Faulty(), "/a")
            second = Sink()
            await ask(link, second)
            assert second.body == b"second" and srv.connections == 2
            link.close()

    srv: Scripted
    run_logging_no_error(main(), caplog)


def test_an_answer_that_ends_with_its_connection_cut_by_a_reset_is_broken_not_whole() -> None:
    """An answer with no length ends when its connection ends: with a FIN it is whole; with
    a reset (RST) it was cut (and the kernel may have dropped what had come), never a whole
    answer."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        await srv.read_request(reader)
        writer.write(OK + b"Connection: close\r\n\r\npartial")
        await writer.drain()
        if i == 0:  # the first is reset, the second closed
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            with pytest.raises(WireError, match="broke before its answer ended"):
                await ask(link, Sink(), "/a")
            whole = Sink()
            await ask(link, whole)
            assert (whole.status, whole.body) == (200, b"partial")
            link.close()

    srv: Scripted
    run(main())


def test_a_connection_still_writing_our_body_when_its_answer_came_is_not_reused() -> None:
    """A server that answers at once (413) without reading a large body may never read the
    rest: the next request goes on a fresh connection, not behind the unsent body."""
    body = b"x" * (32 << 20)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if i == 0:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno")
            await writer.drain()
            await asyncio.Event().wait()  # (reads nothing more, keeps the connection)
        while await srv.read_request(reader) is not None:
            writer.write(SECOND)
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            refused = Sink()
            await ask(link, refused, "/a", body)
            assert (refused.status, refused.body) == (413, b"no")
            second = Sink()
            await ask(link, second)
            assert second.body == b"second" and srv.connections >= 2  # (a spare, maybe)
            link.close()

    srv: Scripted
    run(main())
