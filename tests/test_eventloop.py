"""The engine's loop: uvloop's where it is installed (unless ``VRAMTUI_LOOP=asyncio``), and
the engine's protocols take its transports (they are not asyncio's classes)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from supervisor import eventloop

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_the_engine_runs_on_uvloop_where_it_is_installed(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    import uvloop

    monkeypatch.delenv("VRAMTUI_LOOP", raising=False)  # (a suite run under asyncio's asks it)

    assert eventloop.loop_factory({}) is uvloop.new_event_loop

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(which()).startswith("uvloop")


def test_asyncio_s_loop_when_asked() -> None:
    assert eventloop.loop_factory({"VRAMTUI_LOOP": "asyncio"}) is None
    assert eventloop.loop_factory({"VRAMTUI_LOOP": " AsyncIO "}) is None


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_a_server_s_wire_takes_uvloop_s_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VRAMTUI_LOOP", raising=False)
    # (the engine's protocols asserted asyncio's transport classes: under uvloop a request to
    # a model server never went out, and the HTTP door refused nobody properly)
    from supervisor.servers.wire import Link, Sink

    class Collect(Sink):
        def __init__(self) -> None:
            self.status, self.body = 0, b""

        def head(self, status: int, headers: list[tuple[str, str]]) -> None:
            self.status = status

        def data(self, data: bytes) -> bool:
            self.body += data
            return True

    async def exchange() -> tuple[int, bytes]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link, sink = Link(f"http://127.0.0.1:{port}"), Collect()
        try:
            await link.complete(link.begin("GET", "/", {}, b"", sink))
        finally:
            link.close()
            server.close()
        return sink.status, sink.body

    async def on_uvloop() -> tuple[int, bytes]:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        return await asyncio.wait_for(exchange(), 10)

    assert eventloop.run(on_uvloop()) == (200, b"ok")
