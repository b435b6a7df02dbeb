"""The HTTP routes that forward to model servers, attacked as a red team would (after issue 22).

A real engine with its real HTTP server; the model server is ``tests/hostile_server.py``, raw
sockets answering as an attacker would (cookies, redirects, CORS, ``text/html``, control
characters, endless headers), and reporting back the request exactly as the relay sent it.
The attacks:

- a page on another port (``Sec-Fetch-Site: cross-site``, no ``Origin``, as a browser sends
  an ``<img>``) making the owner's browser ``GET`` / ``HEAD`` / ``OPTIONS`` ``/upstream/…``:
  each of those starts the model server and sends it a request, so they change the engine;
- the token mode: a local process without the token doing the same;
- the model server's answer through ``/upstream``, streamed: an active type, a control
  character in a header, and the headers no server may set on the door's origin;
- headers in a job's ``metadata`` (``Transfer-Encoding`` beside our ``Content-Length``,
  ``Host``), and ``Expect`` from a client, reaching the server;
- a path with ``%2F``, ``%3F``, ``%2e%2e``, ``%252F``: decoded by the relay, the server got
  another request (a query, a step up, a second decoding);
- a server that redirects a websocket's handshake to another host and port;
- a server's escape sequences, reaching the owner's terminal through the event log;
- another local user asking ``/upstream``, ``/running``, ``/logs``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_support import Front, serve_http
from other_user import needs_other_user, run_as_other_user
from spawning import spawns

pytestmark = pytest.mark.timeout(120)
HOSTILE_SERVER = Path(__file__).resolve().parent / "hostile_server.py"
TOKEN = "red-team-token-0123456789abcdef0123"


def hostile_server_backend(name: str = "hs") -> dict[str, Any]:
    return {"name": name, "command": [sys.executable, str(HOSTILE_SERVER), "--port", "${PORT}"],
            "http": {"health": "/health"}, "api": ["chat"], "simulated": True,
            "vram": {"weights": "16MiB", "activation": "0MiB", "context": "0MiB"},
            "safety": "0MiB", "concurrency": 8, "keep_alive": "forever",
            "timeouts": {"start": "20s", "stop_grace": "3s", "request": "10s"}}


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    loud = hostile_server_backend("loud")
    loud["command"].append("--die-loudly")
    with serve_http([hostile_server_backend(), loud]) as f:
        yield f


@pytest.fixture(scope="module")
@spawns
def token_front() -> Iterator[Front]:
    with serve_http([hostile_server_backend()], token=TOKEN, token_source="test") as f:
        yield f


def _job_count(front: Front) -> int:
    return len(front.get("/v1/jobs?limit=1000").json()["data"])


@pytest.mark.process
def test_a_page_on_another_port_cannot_make_the_browser_reach_a_model_server(
        front: Front) -> None:
    before = _job_count(front)
    for method in ("GET", "HEAD", "OPTIONS", "POST"):
        for site in ("cross-site", "same-site"):
            r = front.request(method, "/upstream/hs/raw/steal", headers={"Sec-Fetch-Site": site})
            assert r.status == 403, (method, site, r.status, r.body[:200])
            if method != "HEAD":
                assert r.error["code"] == "bad_origin"
    # an Origin that is not ours, on a GET
    r = front.get("/upstream/hs/raw", headers={"Origin": "http://127.0.0.1:9999"})
    assert r.status == 403
    # a websocket from a page on another port
    r = front.get("/upstream/hs/ws", headers={
        "Origin": "http://127.0.0.1:9999", "Upgrade": "websocket", "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert r.status == 403
    assert _job_count(front) == before  # not one request reached the server
    assert front.engine.backends["hs"].worker is None  # nor was it started
    # the same page served by this very server, a typed address, a client with no browser
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}, {}):
        r = front.get("/upstream/hs/raw/ok", headers=headers)
        assert r.status == 200 and r.body.startswith(b"GET /raw/ok "), (headers, r.body)


@pytest.mark.process
def test_without_the_token_a_local_peer_cannot_reach_a_model_server(token_front: Front) -> None:
    r = token_front.get("/upstream/hs/raw")
    assert r.status == 401, r.body[:200]
    assert token_front.engine.backends["hs"].worker is None
    assert token_front.get("/running").status == 200  # what only reads stays open
    r = token_front.get("/upstream/hs/raw/ok", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status == 200 and r.body.startswith(b"GET /raw/ok ")
    assert b"Bearer" not in r.body and TOKEN.encode() not in r.body  # never forwarded


@pytest.mark.process
def test_a_model_servers_answer_is_data_on_the_doors_origin(front: Front) -> None:
    r = front.get("/upstream/hs/html")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-disposition"].startswith("attachment")  # never shown inline
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"] == "sandbox"
    for name in ("set-cookie", "location", "refresh", "access-control-allow-origin",
                 "access-control-allow-credentials"):
        assert name not in r.headers, name
    # a control character in a header: one clean 502 that says so (the relay's parser
    # refuses the head), not an answer stripped of its headers
    r = front.get("/upstream/hs/control")
    assert r.status == 502 and r.error["code"] == "job_failed", r.body[:300]
    assert "header HTTP/1.1 cannot carry" in r.error["message"], r.body[:300]
    # endless or huge headers: the relay gives up, with one line
    for path in ("/upstream/hs/endless-headers", "/upstream/hs/huge-header"):
        r = front.get(path)
        assert r.status == 502 and r.error["code"] == "job_failed", (path, r.body[:300])
    # a status HTTP cannot carry, or one that would switch protocols: 502
    for code in ("999", "abc", "101", "204"):
        assert front.get(f"/upstream/hs/status/{code}").status == 502, code
    assert front.get("/healthz").status == 200


@pytest.mark.process
def test_no_framing_or_host_header_reaches_a_model_server(front: Front) -> None:
    meta = {"http": {"method": "POST", "path": "/raw", "headers": {
        "host": "evil.example", "transfer-encoding": "chunked", "connection": "keep-alive",
        "content-length": "1", "expect": "100-continue", "x-fine": "yes"}}}
    r = front.post("/v1/jobs", {"backend": "hs", "input": "hi", "metadata": meta})
    assert r.status == 200, r.body[:300]
    seen = r.body.lower()
    assert b"x-fine: yes" in seen
    for bad in (b"evil.example", b"transfer-encoding", b"100-continue", b"content-length: 1\r"):
        assert bad not in seen, (bad, r.body)
    # a client's Expect is the door's business (aiohttp answered it), not the server's
    r = front.request("POST", "/upstream/hs/raw", raw=b"body", headers={
        "Expect": "100-continue", "X-Forwarded-For": "192.0.2.1", "Proxy-Authorization": "x"},
        timeout=8)
    assert r.status == 200, r.body[:300]
    assert b"100-continue" not in r.body.lower() and r.body.endswith(b"\r\n\r\nbody")
    assert b"proxy-authorization" not in r.body.lower()


@pytest.mark.process
def test_a_path_reaches_the_server_as_the_client_wrote_it(front: Front) -> None:
    """Never decoded on the way: ``%2F`` is no slash, ``%3F`` no query, ``%2e%2e`` no step
    up, ``%252F`` not a second ``%2F`` for the server to decode again."""
    for written in ("/raw/a%2Fb", "/raw/q%3Fx=1", "/raw/%2e%2e/x", "/raw/%252F",
                    "/raw/sp%20ace?k=%2F&j=1", "/raw@evil.example:80/x"):
        r = front.get("/upstream/hs" + written)
        assert r.status == 200, (written, r.body[:200])
        assert r.body.startswith(f"GET {written} HTTP/1.1\r\nHost: 127.0.0.1:".encode()), \
            (written, r.body[:200])
    # a request in absolute form (as to a proxy) too
    conn = front.conn()
    try:
        conn.request("GET", f"http://127.0.0.1:{front.port}/upstream/hs/raw/abs%2F")
        body = conn.getresponse().read()
    finally:
        conn.close()
    assert body.startswith(b"GET /raw/abs%2F HTTP/1.1"), body[:100]
    # a job's metadata cannot put a line break into the request line
    meta = {"http": {"method": "GET", "path": "/raw\r\nX-Evil: 1"}}
    r = front.post("/v1/jobs", {"backend": "hs", "input": "hi", "metadata": meta})
    assert r.status == 200 and b"\r\nX-Evil" not in r.body, r.body[:200]


@pytest.mark.process
def test_a_servers_words_reach_no_terminal_as_escapes(front: Front) -> None:
    """Its 5xx body becomes the job's error, its stderr the reason it failed: both are shown
    by the TUI, the CLI and the engine's log, on terminals."""
    r = front.get("/upstream/hs/fail")  # to its HTTP client: its answer as data, as it was
    assert r.status == 500 and r.body.startswith(b"\x1b]0;pwned")
    r = front.post("/v1/chat/completions", {"model": "loud", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status == 502 and "pwned" in r.error["message"], r.body[:300]
    jobs = front.get("/v1/jobs?limit=1000").json()["data"]
    errors = [j["error"] for j in jobs if j["backend"] in ("hs", "loud") and j["error"]]
    logs = front.get("/logs").body.decode()
    assert any("pwned" in e for e in errors) and "pwned" in logs
    for text in (*errors, logs):
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, text
    assert "\n2026-01-01 [info] a forged line" not in logs


WS_HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


@pytest.mark.process
def test_a_server_cannot_send_the_engine_s_websocket_elsewhere(front: Front) -> None:
    """Its handshake answered with a redirect to another host and port (a service only this
    machine may reach): aiohttp's ws_connect would follow it."""
    inner = socket.create_server(("127.0.0.1", 0))
    try:
        to = f"http://127.0.0.1:{inner.getsockname()[1]}/internal-admin"
        r = front.get(f"/upstream/hs/redirect?to={to}", headers=WS_HANDSHAKE)
        assert r.status == 502 and "not followed" in r.error["message"], r.body[:300]
        inner.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody came: the refusal was before the close
            inner.accept()
    finally:
        inner.close()


ATTACK = r'''
import http.client, sys
port = int(sys.argv[1])
for method, path in (("GET", "/upstream/hs/raw"), ("GET", "/running"), ("GET", "/logs"),
                     ("GET", "/unload"), ("POST", "/api/models/unload")):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, headers={"Host": "127.0.0.1"})
    r = c.getresponse()
    print(path, r.status, r.read()[:60])
'''


@needs_other_user
@pytest.mark.process
def test_another_user_reaches_no_model_server_and_reads_no_log(front: Front) -> None:
    out = run_as_other_user(ATTACK, front.port)
    lines = out.stdout.splitlines()
    assert len(lines) == 5, out.stderr
    assert all(line.split()[1] == "403" for line in lines), lines


KEYED_SERVER = r'''
import os, sys
from aiohttp import web
key = sys.argv[3] if sys.argv[2:3] == ["--api-key"] else os.environ["SERVER_KEY"]

@web.middleware
async def keyed(request, handler):
    if request.headers.get("Authorization") != f"Bearer {key}":
        return web.Response(status=401, text="no key")
    return await handler(request)

async def health(request):
    return web.Response(text="ok")

async def ws(request):
    sock = web.WebSocketResponse()
    await sock.prepare(request)
    async for msg in sock:
        await sock.send_str("echo " + msg.data)
    return sock

app = web.Application(middlewares=[keyed])
app.add_routes([web.get("/health", health), web.get("/hello", health), web.get("/ws", ws)])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''

DIRECT = r'''
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
c.request("GET", "/hello")
print(c.getresponse().status)
'''


@pytest.fixture(scope="module")
@spawns
def keyed_front() -> Iterator[Front]:
    keyed = {"name": "keyed", "command": [sys.executable, "-c", KEYED_SERVER, "${PORT}"],
             "env": {"SERVER_KEY": "${API_KEY}"}, "http": {"health": "/health"},
             "api": ["chat"], "simulated": True,
             "vram": {"weights": "16MiB", "activation": "0MiB", "context": "0MiB"},
             "safety": "0MiB", "keep_alive": "forever",
             "timeouts": {"start": "20s", "stop_grace": "3s", "request": "10s"}}
    # the key given on the command line of a server that a shell starts, as llama-swap
    # configs do (`sh -c "exec llama-server … --api-key K"`)
    script = (f"exec {shlex.quote(sys.executable)} -c {shlex.quote(KEYED_SERVER)} "
              "${PORT} --api-key sesame")
    shelled = {**keyed, "name": "keyed-sh", "command": ["sh", "-c", script], "env": {},
               "timeouts": {"start": "10s", "stop_grace": "3s", "request": "10s"}}
    with serve_http([keyed, shelled]) as f:
        yield f


@pytest.mark.process
def test_a_model_server_can_ask_every_caller_for_a_key_only_the_engine_has(
        keyed_front: Front) -> None:
    """A model server listens on loopback, where every local user reaches it, around the
    door's checks. With ``${API_KEY}`` in its ``env`` (llama-server's LLAMA_API_KEY, vLLM's
    VLLM_API_KEY) it is given a secret drawn at each start, which the engine sends with each
    of its requests (health, jobs, websockets) and nobody else knows."""
    r = keyed_front.get("/upstream/keyed/hello")
    assert r.status == 200 and r.body == b"ok", r.body[:200]
    worker = keyed_front.engine.backends["keyed"].worker
    key = worker.launch.api_key
    assert key and len(key) >= 32 and worker.launch.env["SERVER_KEY"] == key
    cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes()  # every user reads it
    assert key.encode() not in cmdline
    with socket.create_connection(("127.0.0.1", keyed_front.port), timeout=10) as s:
        s.sendall(b"GET /upstream/keyed/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 101"), "the websocket carried no key"
    port = int(worker.url.rsplit(":", 1)[1])
    if os.geteuid() == 0 and shutil.which("setpriv"):  # another user, straight to its port
        assert run_as_other_user(DIRECT, port).stdout.strip() == "401"


@pytest.mark.process
def test_the_key_of_a_server_a_shell_starts_goes_with_every_request(keyed_front: Front) -> None:
    """``sh -c "exec SERVER … --api-key K"``: the key is in the script, not a word of the
    command; the engine reads it there, so its health checks and requests are not 401s."""
    r = keyed_front.get("/upstream/keyed-sh/hello")
    assert r.status == 200 and r.body == b"ok", r.body[:200]
    assert keyed_front.engine.backends["keyed-sh"].worker.launch.api_key == "sesame"
