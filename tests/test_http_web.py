"""The dashboard in a browser: /ui serves the real TUI, attached to the engine.

The WebSocket test drives textual-serve's own page protocol from aiohttp's client and checks
from the engine's side (its control socket's connections) that the TUI process attached, and
left when the browser went.  The screenshot test runs headless Chromium and skips cleanly
where there is none (CI installs no browser).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from http_support import Front, expecting, serve_http
from serve_support import echo_backend
from spawning import spawns
from waiting import wait_until

from supervisor.client import Client

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http([echo_backend()], ui=True) as f:
        yield f


def _tui_clients(front: Front) -> list[dict]:
    c = Client(front.sup.paths.control_socket)
    try:
        return [x for x in c.stats()["clients"] if x["pid"] not in (None, os.getpid())]
    finally:
        c.close()


def test_the_browser_dashboard_runs_the_tui_attached_to_the_engine(front: Front) -> None:
    page = front.get("/ui/")
    assert page.status == 200
    assert f"ws://127.0.0.1:{front.port}/ui/ws".encode() in page.body

    async def session() -> bytes:
        got = b""
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{front.base}/ui/ws?width=100&height=30",
                headers={"Origin": f"http://127.0.0.1:{front.port}"}) as ws:
            await ws.send_str(json.dumps(["resize", {"width": 100, "height": 30}]))
            deadline = asyncio.get_running_loop().time() + 60
            while b"SIMULATED" not in got and asyncio.get_running_loop().time() < deadline:
                msg = await ws.receive(timeout=60)
                if msg.type == aiohttp.WSMsgType.BINARY:
                    got += msg.data
                elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
            attached = _tui_clients(front)
            assert attached, "the dashboard's TUI did not attach to the engine"
        return got

    seen = asyncio.run(session())
    assert b"SIMULATED" in seen  # the TUI drew the simulated GPU
    wait_until(lambda: not _tui_clients(front), 30, "the TUI to leave when the browser went")


def _png_colours(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct colours in a sample) of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, kind = struct.unpack(">IIBB", data[16:26])
    pos, idat = 8, b""
    while pos < len(data):
        length, = struct.unpack(">I", data[pos:pos + 4])
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return width, height, len(set(raw[: 200_000]))


@pytest.mark.process
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on this machine")
def test_headless_chromium_screenshot_of_the_dashboard(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "screenshots"))
    try:
        import web as shot  # screenshots/web.py
    finally:
        sys.path.pop(0)
    out = shot.make(tmp_path / "web.png", width=1024, height=640, settle=0.5,
                    demo=False)
    width, height, colours = _png_colours(out.read_bytes())
    assert width == 1024 and 300 < height <= 640  # the viewport (less the window's chrome)
    assert colours > 20  # a drawn dashboard, not a blank page


def test_a_browser_sessions_tui_ends_with_the_server_that_started_it(front: Front) -> None:
    """An abrupt stop of the HTTP server can leave a session's TUI orphaned (textual-serve
    is not always given the time to stop it): it then ends by itself."""
    import subprocess

    from vramtui.app.app import WEB_PARENT_ENV

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    env = dict(os.environ, TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver",
               **{WEB_PARENT_ENV: str(server.pid)})
    tui = subprocess.Popen([sys.executable, "-m", "vramtui", "--attach",
                            str(front.sup.paths.control_socket)], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _tui_clients(front), 30, "the session's TUI to attach")
        server.kill()
        server.wait(10)
        assert tui.wait(20) is not None  # it noticed, and left
        wait_until(lambda: not _tui_clients(front), 30, "the TUI to leave the engine")
    finally:
        for p in (server, tui):
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.mark.process
def test_vramtui_web_says_100_only_after_its_guard() -> None:
    """``vramtui web`` is guarded as the door's /ui is, Expect: 100-continue included: a
    client without the token, or a page of another site, is refused before it is asked for
    its body; a path with nothing there answers its 404 at once."""
    token = "web-expect-token-0123456789abcdef"
    with serve_http([echo_backend()], control=True) as front:
        env = {**front.env, "VRAMTUI_HTTP_TOKEN": token}
        web = subprocess.Popen(
            [sys.executable, "-m", "vramtui", "web", "--http", "127.0.0.1:0", "--attach",
             str(front.sup.paths.control_socket)], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert web.stdout is not None
            line = web.stdout.readline()  # said once it listens
            found = re.search(r"http://127\.0\.0\.1:(\d+)/ui/", line)
            assert found, (line, web.stderr.read() if web.poll() is not None else "")
            port = int(found.group(1))
            auth = {"Authorization": f"Bearer {token}"}
            for method, path, headers, status in (
                    ("GET", "/ui/", {}, b"401"),
                    ("GET", "/ui/", {**auth, "Origin": "http://evil.example"}, b"403"),
                    ("POST", "/ui/ws", {"Host": "rebound.example"}, b"403"),
                    ("POST", "/nosuch", auth, b"404")):
                with expecting(port, path, 10, headers, method=method) as sock:
                    first = sock.recv(65536).split(b"\r\n", 1)[0]
                assert first.startswith(b"HTTP/1.1 " + status), (method, path, first)
            with expecting(port, f"/ui/?token={token}", 2, method="GET") as sock:
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), answer[:100]
        finally:
            web.terminate()
            web.wait(20)

