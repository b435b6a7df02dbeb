"""The engine's HTTP/1.1 connections to a model server (supervisor/servers/wire.py).

Against a real TCP server on loopback, in process, that answers as scripted, byte for byte:
framings (length, chunked cut anywhere, to the close, none), interim answers, keep-alive and
the spare connection, a kept-alive connection the server had closed, broken answers, a sink
that stops, and a cancelled exchange. No process is started.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from waiting import wait_until_async

from supervisor.servers.wire import (
    MAX_HEAD,
    Link,
    WireError,
    request_bytes,
    request_event,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Sink:
    def __init__(self, stop_after: int | None = None) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.pieces: list[bytes] = []
        self.stop_after = stop_after

    def head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status, self.headers = status, headers

    def data(self, data: bytes) -> bool:
        self.pieces.append(data)
        return self.stop_after is None or len(self.pieces) < self.stop_after

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)


class Scripted:
    """A server that runs ``script`` on each connection (``index``: its order)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.ended = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            await self.script(reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.ended += 1
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.closed_by_client.set()
            return None
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


async def ask(link: Link, sink: Sink, path: str = "/b", body: bytes = b"{}",
              method: str = "POST") -> None:
    """One request on ``link``, its answer fed to ``sink``, within 3 s."""
    await asyncio.wait_for(link.complete(link.begin(method, path, {}, body, sink)), 3)


def wire(method: str, target: str, authority: str, headers: dict[str, str],
         body: bytes) -> bytes:
    return request_bytes(request_event(method, target, authority, headers, body), body)


def test_request_bytes_one_write_with_host_and_length() -> None:
    raw = wire("POST", "/v1/chat?x=1", "127.0.0.1:8080",
               {"content-type": "application/json", "Content-Length": "999", "host": "evil"},
               b"{}")
    assert raw == (b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
                   b"content-type: application/json\r\nAccept: */*\r\nContent-Length: 2\r\n"
                   b"\r\n{}")
    assert b"Content-Length" not in wire("GET", "/health", "h:1", {}, b"")


@pytest.mark.parametrize(("method", "target", "headers", "body"), [
    ("POST", "/v1/chat/completions", {"content-type": "application/json"}, b'{"a":1}'),
    ("GET", "/health", {}, b""),
    ("DELETE", "/slots/0?x=%2F", {"Accept": "text/plain", "X-Y": "a  b"}, b"body"),
    ("POST", "/", {"accept-encoding": "gzip", "HOST": "evil", "transfer-encoding": "x"}, b""),
    ("PUT", "/caf%C3%A9", {"X-Name": "café", "X-Pad": "  a\tb  "}, b"x" * 70_000),
])
def test_the_request_written_is_read_by_a_real_server_as_it_was_asked(
        method: str, target: str, headers: dict[str, str], body: bytes) -> None:
    # The bytes we write, read by a server nobody here wrote (aiohttp's): the method, the
    # target, our Host, the client's headers (never its framing), and the body whole.
    seen: dict[str, object] = {}

    async def echo(request: web.Request) -> web.Response:
        seen.update(method=request.method, target=request.raw_path, host=request.host,
                    headers={k.decode().lower(): v for k, v in request.raw_headers},
                    body=await request.read())
        return web.Response(body=b"ok")

    async def main() -> None:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", echo)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        link = Link(f"http://127.0.0.1:{port}")
        sink = Sink()
        try:
            await link.complete(link.begin(method, target, headers, body, sink))
        finally:
            link.close()
            await runner.cleanup()
        assert (sink.status, sink.body) == (200, b"ok")

    run(main())
    got = seen["headers"]
    assert isinstance(got, dict)
    assert (seen["method"], seen["target"], seen["body"]) == (method, target, body)
    assert seen["host"] == got["host"].decode() and got["host"].startswith(b"127.0.0.1:")
    assert "transfer-encoding" not in got
    assert got.get("content-length", b"0") == str(len(body)).encode()
    for name, value in headers.items():
        if name.lower() not in ("host", "transfer-encoding"):
            assert got[name.lower()] == value.strip(" \t").encode()  # the bytes, as UTF-8


@pytest.mark.parametrize(("method", "target", "headers", "said"), [
    ("GET", "/a b", {}, "not a request target"),
    ("GET", "/a\x00", {}, "not a request target"),
    ("GE T", "/", {}, "not an HTTP method"),
    ("GET", "/", {"X-A": "1\r\nX-Smuggled: 1"}, "X-A"),
    ("GET", "/", {"X-A": "a\x00b"}, "X-A"),
    ("GET", "/", {"X A": "1"}, "X A"),
    ("GET", "/", {"X-A:": "1"}, "X-A:"),
])
def test_a_request_http_cannot_carry_is_never_written(
        method: str, target: str, headers: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("\x00", "")):
        request_event(method, target, "h:1", headers, b"")


@pytest.mark.parametrize("cut", [1, 3, 7, 1000])
def test_chunked_answer_cut_anywhere_comes_through_byte_exact(cut: int) -> None:
    events = [b'data: {"a":1}\n\n', b"data: \xc3\xa9\r\n\r\n", b"data: [DONE]\n\n"]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nX-T: 1\r\n\r\n"
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n" + wire)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while await srv.read_request(reader) is not None:
            for at in range(0, len(answer), cut):
                writer.write(answer[at:at + cut])
                await writer.drain()
                await asyncio.sleep(0)

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            for _ in range(2):
                sink = Sink()
                await link.complete(link.begin("POST", "/v1/x", {}, b"{}", sink))
                assert sink.status == 200 and sink.body == b"".join(events)
                assert ("Content-Type", "text/event-stream") in sink.headers
            assert srv.connections == 1  # kept alive
            link.close()

    srv: Scripted
    run(main())


def test_length_close_and_bodiless_answers() -> None:
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nto the end",
    ]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(answers[len(srv.requests) - 1])
            if len(srv.requests) == 3:
                return  # (closes: the answer ends with the connection)

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            got = []
            for _ in answers:
                sink = Sink()
                await link.complete(link.begin("GET", "/a b", {}, b"", sink))
                got.append((sink.status, sink.body))
            assert got == [(201, b"hello"), (204, b""), (200, b"to the end")]
            assert srv.requests[0].startswith(b"GET /a%20b HTTP/1.1\r\n")
            link.close()

    srv: Scripted
    run(main())


def test_a_server_that_closes_after_each_answer_gets_a_spare() -> None:
    """llama-server closes after a stream: the next request finds a connection open."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"2\r\nok\r\n0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            for n in range(1, 4):
                sink = Sink()
                ex = link.begin("POST", "/s", {}, b"{}", sink, reuse=False)
                assert (ex.done is not None) == (n > 1), "the spare was not used"
                await link.complete(ex)
                assert sink.body == b"ok"
                await wait_until_async(lambda n=n: srv.connections == n + 1, 10,
                                       "the spare to connect")
            assert srv.connections == 4  # one each, plus the spare now idle
            link.close()

    srv: Scripted
    run(main())


def test_a_kept_alive_connection_the_server_closed_is_tried_again() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await srv.read_request(reader)  # the next one: closed without a word

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            for _ in range(3):
                sink = Sink()
                await link.complete(link.begin("POST", "/k", {}, b"{}", sink))
                assert sink.body == b"ok"
            assert srv.connections == 3 and len(srv.requests) == 5  # two tried again
            link.close()

    srv: Scripted
    run(main())


@pytest.mark.parametrize(("answer", "said"), [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "before its answer ended"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "framing"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "before its answer ended"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD + 10), "head passed"),
])
def test_broken_answers_fail_with_a_reason(answer: bytes, said: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is not None:
            writer.write(answer)
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            with pytest.raises(WireError, match=said):
                await link.complete(link.begin("POST", "/b", {}, b"{}", Sink()))
            link.close()

    srv: Scripted
    run(main())


def test_a_sink_that_stops_and_a_cancelled_exchange_close_the_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is None:
            return
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:  # an endless stream, until the client goes
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.001)

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            sink = Sink(stop_after=3)
            await link.complete(link.begin("POST", "/e", {}, b"{}", sink))
            assert sink.body == b"xxx"
            sink = Sink()
            task = asyncio.ensure_future(link.complete(link.begin("POST", "/e", {}, b"", sink)))
            while len(sink.pieces) < 2:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while srv.ended < 2:  # each connection closed: the server saw its client go
                await asyncio.sleep(0.001)
            assert srv.connections == 2
            link.close()

    srv: Scripted
    run(main())


def test_an_https_server_is_reached_over_tls() -> None:
    link = Link("https://models.example")
    assert (link.port, link.authority, link.tls is not None) == (443, "models.example:443", True)
    assert Link("http://[::1]:8080").authority == "[::1]:8080"


def test_a_204_with_a_body_is_broken() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is not None:
            writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nbody!")
            await writer.drain()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            with pytest.raises(WireError, match="204"):
                await link.complete(link.begin("GET", "/n", {}, b"", Sink()))
            link.close()

    srv: Scripted
    run(main())


def test_non_ascii_header_values_travel_as_the_bytes_they_were() -> None:
    # The door reads a client's header bytes as UTF-8 and writes an answer's headers as
    # UTF-8: a value such as a UTF-8 file name must reach the server, and come back from
    # it, as the same bytes (not refused, not re-encoded as Latin-1 into mojibake).
    raw = wire("GET", "/view", "h:1", {"X-Name": "café", "X-Odd": "caf\udce9"}, b"")
    assert b"\r\nX-Name: caf\xc3\xa9\r\n" in raw and b"\r\nX-Odd: caf\xe9\r\n" in raw
    answer = (b"HTTP/1.1 200 OK\r\nContent-Disposition: filename=\"caf\xc3\xa9.png\"\r\n"
              b"X-Latin: caf\xe9\r\nContent-Length: 2\r\n\r\nok")

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(answer)

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url)
            sink = Sink()
            await link.complete(link.begin("GET", "/view", {"X-Name": "café"}, b"", sink))
            link.close()
        assert b"\r\nX-Name: caf\xc3\xa9\r\n" in srv.requests[0]
        headers = dict(sink.headers)
        assert headers["Content-Disposition"].encode() == b'filename="caf\xc3\xa9.png"'
        assert headers["X-Latin"] == "café"  # not UTF-8: read as Latin-1, never a failure

    srv: Scripted
    run(main())


def test_an_exchange_given_up_before_it_is_completed_leaves_no_unretrieved_error() -> None:
    """Written on an idle connection, then never completed (its job cancelled before its task
    ran, its server gone): the connection's end must not leave asyncio a "Future exception
    was never retrieved" to log."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await srv.read_request(reader)  # the next one: closed without a word

    async def main() -> None:
        nonlocal srv
        told: list[str] = []
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: told.append(context["message"]))
        async with Scripted(script) as srv:
            link = Link(srv.url)
            await ask(link, Sink())  # (its connection is kept, idle)
            given_up = [link.begin("POST", "/x", {}, b"{}", Sink())]
            written = given_up[0].done
            assert written is not None  # written on the idle connection, never completed
            await wait_until_async(written.done, 10, "the connection's end")
            del given_up[:], written
            gc.collect()
            link.close()
        assert not told, told

    srv: Scripted
    run(main())


def test_an_answer_silent_past_the_idle_limit_fails_and_its_connection_closes() -> None:
    # Connection 0 answers in pieces 0.1 s apart (2 s in all, past the limit of 1 s): each
    # piece is well within the limit (a loaded machine may delay one), so it is whole.
    # Connection 1 sends its head and one piece, then nothing: it fails at the limit, and the
    # server sees its client go.
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        if await srv.read_request(reader) is None:
            return
        await asyncio.sleep(0.2)  # (its first byte too may come late, within the limit)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
        for _ in range(20 if i == 0 else 0):
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
        if i == 0:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return
        await writer.drain()
        if await reader.read(1) == b"":
            gone.set()

    async def main() -> None:
        nonlocal srv
        async with Scripted(script) as srv:
            link = Link(srv.url, idle_s=1.0)
            sink = Sink()
            await link.complete(link.begin("POST", "/a", {}, b"{}", sink, reuse=False))
            assert sink.body == b"x" * 21
            sink = Sink()
            started = time.monotonic()
            with pytest.raises(WireError, match=r"it sent nothing for 1 s \(timeouts\.idle\)"):
                await link.complete(link.begin("POST", "/b", {}, b"{}", sink, reuse=False))
            assert 1.0 < time.monotonic() - started < 5 and sink.body == b"x"
            await asyncio.wait_for(gone.wait(), 5)
            link.close()

    srv: Scripted
    gone = asyncio.Event()
    run(main())
