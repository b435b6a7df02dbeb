"""The HTTP door's trust boundary, attacked as the red team did (issue 22).

Each test is the attacker's own program against a real engine and its real HTTP server:

- another local user (uid 65534, a real process via ``setpriv``) racing the peer check:
  it sends ``POST /v1/jobs`` and closes at once, beside idle connections that slow the loop;
  the truth is the engine's job table, read by its owner;
- a page on another port of the same host: a cross-origin POST (``text/plain``, as a browser
  sends without a preflight) and the dashboard's WebSocket opened from that origin;
- a ``metadata`` nested 900 levels deep, and JSON nested deeper than Python can parse;
- a flood of half-sent connections from the other user beside the owner's timed request,
  against ``vramtui --serve`` started under the common open-file limit of 1,024;
- a worker steered to answer with ``text/html``, control characters in its headers, a
  redirect, CORS and a cookie.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import ROOT
from http_support import Front, Reply, serve_http
from other_user import OTHER_UID, needs_other_user, run_as_other_user, start_as_other_user
from serve_support import cli, echo_backend, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from supervisor.http.peer import Peer, identify_socket, table_row
from vramtui.exits import Exit
from vramtui.http_serve import front_door_url

pytestmark = pytest.mark.timeout(120)
TOKEN = "trust-boundary-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = ROOT / "tests" / "workers" / "hostile.py"


def hostile_backend() -> dict[str, object]:
    return {"name": "hostile", "script": str(HOSTILE),
            "vram": {"weights": "0MiB", "activation": "16MiB"}, "timeouts": {"stop_grace": "3s"}}


@pytest.fixture(scope="module")
@spawns
def open_front() -> Iterator[Front]:
    """The default setup: loopback, no token (the engine's user only)."""
    with serve_http([echo_backend(), hostile_backend()]) as f:
        yield f


@pytest.fixture(scope="module")
@spawns
def token_front() -> Iterator[Front]:
    with serve_http([echo_backend()], token=TOKEN, token_source="test", ui=True) as f:
        yield f


def _jobs(front: Front) -> list[dict[str, object]]:
    r = front.get("/v1/jobs?limit=1000")
    assert r.status == 200, r.body[:300]
    return r.json()["data"]


# -- 1. another local user racing the peer check ------------------------------------------

RACE = r'''
import socket, sys
port, idle_n, tries = (int(a) for a in sys.argv[1:4])
idle = []
for _ in range(idle_n):
    try:
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
        break
body = b'{"backend": "echo", "input": "from another user"}'
request = (b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Prefer: respond-async\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
for _ in range(tries):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(request)
    s.close()  # before the engine reads a byte: the old check saw a TIME_WAIT row, uid 0
print(len(idle), flush=True)
sys.stdin.read()  # hold the idle connections until the test has looked
'''


@needs_other_user
def test_another_user_racing_the_peer_check_gets_no_job_in(open_front: Front) -> None:
    before = len(_jobs(open_front))
    gate = open_front.server.stats()["connections"]
    seen = gate["accepted"] + gate["refused"]
    forbidden = open_front.server.counters["refused"]
    attacker = start_as_other_user(RACE, open_front.port, 4, 10)
    try:
        assert attacker.stdout is not None
        held = int(attacker.stdout.readline() or "-1")
        assert held == 4, attacker.stderr.read() if attacker.stderr else ""
        key = f"uid {OTHER_UID}"

        def handled() -> bool:  # every racing connection judged and closed; the idle remain
            now = open_front.server.stats()["connections"]
            return (now["accepted"] + now["refused"] >= seen + held + 10
                    and now["peers"].get(key) == held)

        wait_until(handled, 30, "the racing connections to be handled")
        assert len(_jobs(open_front)) == before  # not one job from the other user
        # each was refused as uid 65534 (named at accept), or as unknown: never let in
        assert open_front.server.counters["refused"] - forbidden == 10
    finally:
        with contextlib.suppress(Exception):
            attacker.communicate("", timeout=10)
        if attacker.poll() is None:
            attacker.kill()


def test_a_closed_client_is_unknown_never_root() -> None:
    """The kernel's own table is the truth: once the client closed, its row is no longer an
    established socket with an inode, and the peer is unknown (not uid 0)."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            live = identify_socket(accepted)
            assert live.local and live.uid == os.geteuid()
            ends = (accepted.getpeername(), accepted.getsockname())
            row = table_row(*ends)  # /proc's answer agrees with sock_diag's
            assert row is not None and row.names_a_user and row.uid == os.geteuid()
            client.close()
            gone = identify_socket(accepted)
            assert gone.local and gone.uid is None, gone
            row = table_row(*ends)
            assert row is None or not row.names_a_user, row
    finally:
        server.close()


def test_root_is_every_user_only_where_the_kernel_vouches() -> None:
    assert not Peer(True, 0, "127.0.0.1:40000").is_user(1000)  # TCP: uid 0 is no one special
    assert Peer(True, 0, "unix socket pid 1", vouched=True).is_user(1000)
    assert Peer(True, 1000, "127.0.0.1:40000").is_user(1000)
    assert not Peer(True, None, "127.0.0.1:40000").is_user(1000)
    assert not Peer(False, 1000, "192.0.2.1").is_user(1000)


# -- 2. a page on another port ----------------------------------------------------------

def test_a_page_on_another_port_cannot_post(open_front: Front) -> None:
    port = open_front.port
    body = b'{"backend": "echo", "input": 1}'
    before = len(_jobs(open_front))
    for origin in (f"http://127.0.0.1:{port + 1 if port < 65535 else 1}",
                   "http://127.0.0.1:9999", f"https://127.0.0.1:{port}", "https://127.0.0.1",
                   "http://localhost:9999", f"http://localhost:{port}", "null"):
        r = open_front.request("POST", "/v1/jobs", raw=body,
                               headers={"Content-Type": "text/plain", "Origin": origin})
        assert r.status == 403 and r.error["code"] == "bad_origin", (origin, r.body)
    # a browser that says the request crosses sites is refused even without an Origin
    r = open_front.request("POST", "/v1/jobs", raw=body, headers={
        "Content-Type": "text/plain", "Sec-Fetch-Site": "same-site"})
    assert r.status == 403 and r.error["code"] == "bad_origin"
    assert len(_jobs(open_front)) == before
    same = open_front.request("POST", "/v1/jobs", raw=body, headers={
        "Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}",
        "Sec-Fetch-Site": "same-origin"})
    assert same.status == 200 and same.body == b"1"
    curl = open_front.post("/v1/jobs", {"backend": "echo", "input": 2})  # no Origin at all
    assert curl.status == 200 and curl.body == b"2"


def _ws_upgrade(cookie: str, origin: str) -> dict[str, str]:
    return {"Cookie": cookie, "Origin": origin, "Upgrade": "websocket",
            "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def test_the_dashboard_cookie_is_not_the_token_and_the_token_leaves_the_url(
        token_front: Front) -> None:
    r = token_front.get(f"/ui/?token={TOKEN}")
    assert r.status == 303 and r.headers["location"] == "/ui/"  # the token leaves the URL
    cookie = r.headers["set-cookie"]
    assert TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    pair = cookie.split(";", 1)[0]
    name, _, value = pair.partition("=")
    assert re.fullmatch(r"vramtui_ui_[0-9a-f]{16}", name) and len(value) >= 32
    page = token_front.get("/ui/", headers={"Cookie": pair})
    assert page.status == 200 and b"textual" in page.body.lower()
    assert token_front.get("/ui/", headers={"Cookie": f"{name}=not-a-session"}).status == 401
    assert token_front.get("/ui/", headers={"Cookie": f"vramtui_token={TOKEN}"}).status == 401
    # the cookie is no bearer token anywhere else
    assert token_front.post("/v1/backends/unload", headers={"Cookie": pair}).status == 401


def test_the_dashboard_websocket_refuses_another_port(token_front: Front) -> None:
    r = token_front.get(f"/ui/?token={TOKEN}")
    pair = r.headers["set-cookie"].split(";", 1)[0]
    port = token_front.port
    for origin in ("http://127.0.0.1:9999", f"https://127.0.0.1:{port}",
                   "http://localhost:9999"):
        ws = token_front.get("/ui/ws", headers=_ws_upgrade(pair, origin))
        assert ws.status == 403, (origin, ws.status, ws.body[:200])
    ok = token_front.get("/ui/ws", headers=_ws_upgrade(pair, f"http://127.0.0.1:{port}"))
    assert ok.status == 101


@pytest.fixture(scope="module")
@spawns
def ui_front() -> Iterator[Front]:
    """The default setup with the dashboard: loopback, no token."""
    with serve_http([echo_backend()], ui=True) as f:
        yield f


def test_another_site_cannot_frame_the_dashboard(ui_front: Front) -> None:
    """Clickjacking: a page of another site puts the dashboard in an invisible ``<iframe>``;
    the framed page is of our origin, so its WebSocket (the whole TUI) passes the Origin
    check, and the user's clicks and keys meant for the page on top drive the TUI."""
    port = ui_front.port
    framed = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "iframe",
              "Sec-Fetch-Mode": "navigate"}
    for path in ("/ui/", "/ui"):
        r = ui_front.get(path, headers=framed)
        assert r.status == 403 and r.error["code"] == "bad_origin", (path, r.status, r.body)
        assert b"textual" not in r.body.lower()
    r = ui_front.get("/ui/", headers={**framed, "Sec-Fetch-Site": "same-site"})
    assert r.status == 403
    # typed, or a link of our own: served, and no page (not even ours) may frame it
    for site in ("none", "same-origin", None):
        headers = {"Sec-Fetch-Dest": "document"} | ({"Sec-Fetch-Site": site} if site else {})
        page = ui_front.get("/ui/", headers=headers)
        assert page.status == 200 and b"textual" in page.body.lower(), (site, page.status)
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # the page's own WebSocket still opens
    ws = ui_front.get("/ui/ws", headers={**_ws_upgrade("", f"http://127.0.0.1:{port}"),
                                          "Sec-Fetch-Site": "same-origin"})
    assert ws.status == 101, ws.body[:200]


PLANT_TOKEN = r'''
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, sys.argv[2].encode() + b"\n")
os.close(fd)
'''


@pytest.mark.process
@needs_other_user
def test_a_token_file_of_another_user_is_refused() -> None:
    """The other user writes the token file first, ``chmod 600`` as asked: private by its
    mode, but its owner knows the token (an engine run as root read it and let that user
    in with it)."""
    root = new_root()
    os.chmod(root, 0o711)
    shared = root / "shared"  # a sticky directory anyone may write in, as /tmp
    shared.mkdir()
    os.chmod(shared, 0o1777)
    planted = shared / "http.token"
    done = run_as_other_user(PLANT_TOKEN, planted, "the-other-user-knows-this-token-0123")
    assert done.returncode == 0, done.stderr
    env = make_env(root)
    r = cli(env, "web", "--http", "127.0.0.1:0", "--http-token-file", str(planted))
    assert r.returncode == Exit.USAGE, (r.returncode, r.stderr)
    assert f"belongs to uid {OTHER_UID}" in r.stderr
    own = root / "own.token"  # the same, of the engine's user: read (then: no engine here)
    own.write_text("a-token-of-the-engines-own-user-0123\n")
    os.chmod(own, 0o600)
    r = cli(env, "web", "--http", "127.0.0.1:0", "--http-token-file", str(own))
    assert r.returncode == Exit.NO_ENGINE, (r.returncode, r.stderr)


READ_LOG = r'''
import sys
try:
    print(len(open(sys.argv[1]).read()))
except OSError as exc:
    print(type(exc).__name__)
'''


@pytest.mark.process
@needs_other_user
def test_the_log_file_is_private_and_never_another_users() -> None:
    """``--log-file``: what workers and servers say, their errors and logs' last lines. It
    was made by the umask (0644 here, 0666 for a server started so) for every user to
    read, and a file another user made first was appended to, theirs to read."""
    root = new_root()
    os.chmod(root, 0o711)
    shared = root / "shared"  # a sticky directory anyone may write in, as /tmp
    shared.mkdir()
    os.chmod(shared, 0o1777)
    env = make_env(root, [echo_backend()])
    planted = shared / "planted.log"
    done = run_as_other_user("import sys, os; open(sys.argv[1], 'w').close(); "
                             "os.chmod(sys.argv[1], 0o666)", planted)
    assert done.returncode == 0, done.stderr
    r = cli(env, "--serve", "--gpus", "sim:8GiB", "--log-file", str(planted))
    assert r.returncode == Exit.USAGE, (r.returncode, r.stderr[-500:])
    assert "not a regular file of ours" in r.stderr
    assert os.path.getsize(planted) == 0
    link = root / "link.log"  # a link, even to a file of ours: said so, in one line
    link.symlink_to(root / "target.log")
    r = cli(env, "--serve", "--gpus", "sim:8GiB", "--log-file", str(link))
    assert r.returncode == Exit.USAGE and "it is a link" in r.stderr, r.stderr[-500:]
    assert not (root / "target.log").exists()
    log_file = shared / "engine.log"
    served = start_serve(env, root, "--log-file", str(log_file))  # (reap removes root)
    try:
        assert "engine started" in log_file.read_text()
        assert os.stat(log_file).st_mode & 0o777 == 0o600
        assert run_as_other_user(READ_LOG, log_file).stdout.strip() == "PermissionError"
    finally:
        reap(served)


# -- 3. a deep metadata, deep JSON -----------------------------------------------------------

def _nested(levels: int) -> dict[str, object]:
    out: dict[str, object] = {}
    node = out
    for _ in range(levels - 1):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    return out


def test_deep_metadata_is_refused_at_submit_and_the_job_list_stays_whole(
        open_front: Front) -> None:
    before = len(_jobs(open_front))
    r = open_front.post("/v1/jobs", {"backend": "echo", "input": 1, "metadata": _nested(900)})
    assert r.status == 400 and "nests more than" in r.error["message"], r.body[:300]
    r = open_front.post("/v1/jobs", {"backend": "echo", "input": 1, "metadata": _nested(40)})
    assert r.status == 400 and "metadata nests more than 32" in r.error["message"], r.body
    r = open_front.post("/v1/jobs", {"backend": "echo", "input": _nested(80)})
    assert r.status == 400 and "input nests more than 64" in r.error["message"], r.body
    deep = b'{"backend": "echo", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = open_front.request("POST", "/v1/jobs", raw=deep)
    assert r.status == 400 and "nest" in r.error["message"], r.body[:300]
    r = open_front.request("POST", "/v1/chat/completions", raw=b"[" * 50_000 + b"]" * 50_000)
    assert r.status == 400, r.body[:300]
    assert len(_jobs(open_front)) == before
    fine = open_front.post("/v1/jobs", {"backend": "echo", "input": 3,
                                        "metadata": _nested(20)})
    assert fine.status == 200
    listed = _jobs(open_front)
    assert len(listed) == before + 1 and listed[0]["metadata"] == _nested(20)


# -- 4. connections before auth ------------------------------------------------------------

FLOOD = r'''
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(count):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /v1/backends HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never ends
        held.append(s)
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()
'''


def _low_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


@pytest.mark.process
@needs_other_user
def test_a_connection_flood_from_another_user_leaves_the_owner_served() -> None:
    root = new_root()
    env = make_env(root, [echo_backend()])
    served = start_serve(env, root, "--http", "127.0.0.1:0", preexec=_low_nofile)
    try:
        url = wait_until(lambda: front_door_url(served.stdout()), 30, "the HTTP line")
        port = int(url.rsplit(":", 1)[1])
        pid = served.proc.pid
        limits = Path(f"/proc/{pid}/limits").read_text()
        soft = next(int(x.split()[3]) for x in limits.splitlines()
                    if x.startswith("Max open files"))
        assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # raised to the hard
        attacker = start_as_other_user(FLOOD, port, 1500)
        try:
            assert attacker.stdout is not None
            assert int(attacker.stdout.readline() or "0") > 0
            for _ in range(3):  # the owner, while the flood holds
                t0 = time.monotonic()
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /v1/backends HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Connection: close\r\n\r\n")
                    answer = b""
                    while chunk := s.recv(65536):
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
                assert time.monotonic() - t0 < 5.0  # a liveness bound, not a benchmark
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            assert fds < 600, fds  # the other user's connections are capped, not held
        finally:
            with contextlib.suppress(Exception):
                attacker.communicate("", timeout=10)
            if attacker.poll() is None:
                attacker.kill()
        assert "Too many open files" not in served.stderr()
        assert "refused" in served.stderr()  # the cap said what it did
    finally:
        reap(served)


def test_half_sent_headers_are_cut_at_their_deadline(open_front: Front) -> None:
    gate = open_front.server.gate
    old = gate.header_timeout_s
    gate.header_timeout_s = 0.5  # the default (10 s) is too long for a test
    before = open_front.server.stats()["connections"]["header_timeouts"]
    try:
        s = socket.create_connection(("127.0.0.1", open_front.port), timeout=30)
        try:
            s.sendall(b"GET /v1/backends HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            s.sendall(b"X-Slow: 1\r\n")  # a byte now and then: the deadline is the headers'
            t0 = time.monotonic()
            assert s.recv(100) == b""  # closed by the server, no answer
            assert time.monotonic() - t0 < 5.0  # the deadline, not the 10 s default
        finally:
            s.close()
    finally:
        gate.header_timeout_s = old
    assert open_front.server.stats()["connections"]["header_timeouts"] == before + 1



def _body_refused(answer: bytes, why: str) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer[:200]
    message = json.loads(body)["error"]["message"]
    assert why in message and "\n" not in message, message


def test_a_body_that_stops_coming_or_dribbles_is_answered_408(open_front: Front) -> None:
    gate = open_front.server.gate
    old = gate.body_idle_s, gate.body_min_rate
    gate.body_idle_s, gate.body_min_rate = 0.5, 10.0  # (the defaults, 30 s, are too long)
    before = open_front.server.stats()["connections"]["body_timeouts"]
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n")

    def answer(s: socket.socket) -> bytes:
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got

    try:
        with socket.create_connection(("127.0.0.1", open_front.port), timeout=30) as s:
            # declares 100 bytes, sends 10, then nothing: it held its connection for good
            s.sendall(head % 100 + b'{"backend"')
            t0 = time.monotonic()
            _body_refused(answer(s), "sent nothing for 0.5 s")  # then closed
            assert time.monotonic() - t0 < 5.0  # the idle time, not the 30 s default
        assert open_front.server.stats()["connections"]["body_timeouts"] == before + 1
        # A byte now and then, never idle as long, far slower than 10 bytes a second: cut.
        with socket.create_connection(("127.0.0.1", open_front.port), timeout=30) as s:
            s.sendall(head % 100 + b"{")
            t0 = time.monotonic()
            with contextlib.suppress(OSError):  # (cut while it sends)
                while time.monotonic() - t0 < 10.0:
                    time.sleep(0.2)  # the client's pace, not a wait for a condition
                    s.sendall(b" ")
            _body_refused(answer(s), "came slower than 10 bytes a second")
            assert time.monotonic() - t0 < 5.0
        assert open_front.server.stats()["connections"]["body_timeouts"] == before + 2
        # A slow body that keeps coming, faster than that, is not cut: read whole, judged.
        body = json.dumps({"backend": "nosuch", "input": {"pad": " " * 40}}).encode()
        with socket.create_connection(("127.0.0.1", open_front.port), timeout=30) as s:
            s.sendall(head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
                      % len(body))
            for i in range(0, len(body), 3):
                time.sleep(0.05)  # the client's pace (60 bytes a second) over 1.2 s
                s.sendall(body[i:i + 3])
            got = answer(s)
        assert got.startswith(b"HTTP/1.1 404"), got[:200]
        assert b"nosuch" in got
    finally:
        gate.body_idle_s, gate.body_min_rate = old
    assert open_front.server.stats()["connections"]["body_timeouts"] == before + 2

# -- 5. results as data ------------------------------------------------------------------

def test_an_html_result_is_served_as_an_attachment_in_a_sandbox(open_front: Front) -> None:
    page = "<html><script>fetch('/v1/backends/unload', {method: 'POST'})</script></html>"
    r = open_front.post("/v1/jobs", {"backend": "hostile", "input": {
        "body": page, "headers": {"Content-Type": "text/html; charset=utf-8"}}})
    assert r.status == 200 and r.body == page.encode()
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"] == "sandbox"
    assert r.headers["content-disposition"].startswith("attachment")
    svg = open_front.post("/v1/jobs", {"backend": "hostile", "input": {
        "body": "<svg onload='alert(1)'/>", "headers": {"Content-Type": "image/svg+xml"}}})
    assert svg.headers["content-disposition"].startswith("attachment")
    png = open_front.post("/v1/jobs", {"backend": "hostile", "input": {
        "body": "png", "headers": {"Content-Type": "image/png"}}})
    assert png.headers["x-content-type-options"] == "nosniff"
    assert "content-disposition" not in png.headers  # passive types stay inline
    job = png.headers["x-vramtui-job"]
    again = open_front.get(f"/v1/jobs/{job}/result")
    assert again.headers["content-security-policy"] == "sandbox"


def test_a_workers_headers_pass_an_allow_list(open_front: Front) -> None:
    r = open_front.post("/v1/jobs", {"backend": "hostile", "input": {
        "body": "moved", "status": 302, "headers": {
            "Location": "https://evil.example/", "Access-Control-Allow-Origin": "*",
            "Refresh": "0; url=https://evil.example/", "Set-Cookie": "a=b",
            "Content-Security-Policy": "default-src *", "X-Content-Type-Options": "sniff",
            "Cache-Control": "max-age=60", "X-Model-Seed": "42",
            "Content-Disposition": "inline; filename=out.txt",
            "Content-Type": "text/plain"}}})
    assert r.status == 302
    for gone in ("location", "access-control-allow-origin", "refresh", "set-cookie"):
        assert gone not in r.headers, gone
    assert r.headers["content-security-policy"] == "sandbox"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "max-age=60" and r.headers["x-model-seed"] == "42"
    assert r.headers["content-disposition"] == "inline; filename=out.txt"


@pytest.mark.parametrize("bad", ["\x0b", "\x0c", "\x7f", "\x01", "\t", "\r\nX-Injected: 1"])
def test_a_control_character_in_a_workers_header_is_a_clean_502(open_front: Front,
                                                                   bad: str) -> None:
    r = open_front.post("/v1/jobs", {"backend": "hostile", "input": {
        "body": "x", "headers": {"X-Note": f"a{bad}b"}}})
    assert r.status == 502 and r.error["code"] == "bad_worker_header", r.body[:300]
    assert "x-injected" not in r.headers
    job = r.error["message"].split()[1].rstrip(":")
    again = open_front.get(f"/v1/jobs/{job}/result")
    assert again.status == 502 and again.error["code"] == "bad_worker_header"
    assert open_front.get("/v1/backends").status == 200  # the door is fine


def test_every_log_a_worker_wrote_in_is_served_as_sandboxed_text(open_front: Front) -> None:
    """A worker's words reach the engine's event log (its error) and its own log: whichever
    route serves them, they are text that no browser sniffs into a page or runs."""
    page = "<html><script>fetch('/v1/backends/unload', {method: 'POST'})</script></html>"
    r = open_front.post("/v1/jobs", {"backend": "hostile", "input": {"status": page}})
    assert r.status == 502 and page in r.error["message"], r.body[:300]
    served = {path: open_front.get(path) for path in
              ("/logs", "/log", "/v1/backends/hostile/logs?lines=100")}
    conn = open_front.conn()
    try:  # the followed log (llama-swap's /logs/stream/MODEL redirects there)
        moved = open_front.get("/logs/stream/hostile")
        assert moved.status == 307, moved.body[:200]
        conn.request("GET", moved.headers["location"])
        followed = conn.getresponse()
        served["followed"] = Reply(followed.status,
                                   {k.lower(): v for k, v in followed.getheaders()}, b"")
    finally:
        conn.close()
    assert page in served["/logs"].body.decode() and page in served["/log"].body.decode()
    for path, reply in served.items():
        assert reply.status == 200, (path, reply.body[:200])
        assert reply.headers["content-type"] == "text/plain; charset=utf-8", path
        assert reply.headers["x-content-type-options"] == "nosniff", path
        assert reply.headers["content-security-policy"] == "sandbox", path


# -- the control socket: a dribbler keeps nobody out -------------------------------------------

@pytest.mark.process
def test_dribbling_control_clients_leave_a_slot_for_status() -> None:
    from serve_support import RawConn, hello_frame, in_process

    from supervisor.client import Client
    from supervisor.control.errors import TooManyConnections
    from supervisor.control.limits import ControlLimits

    limits = ControlLimits(max_connections=16, partial_grace_s=0.3)
    with in_process([echo_backend()], limits=limits) as (sup, server, _root):
        dribblers: list[RawConn] = []
        try:
            for _ in range(16):
                conn = RawConn(server.path)
                conn.hello()
                frame = hello_frame()
                conn.send(frame[:3])  # a frame begun, and then a byte now and then
                dribblers.append(conn)
            wait_until(lambda: len(server.connections) == 16, 10, "the dribblers to be in")

            def status() -> bool:  # the owner's status finds a slot, once they trickle
                try:
                    client = Client(server.path)
                except TooManyConnections:
                    return False
                try:
                    return bool(client.snapshot().backends)
                finally:
                    client.close()

            wait_until(status, 10, "a slot for the owner's status")
            assert server.stats()["evicted"] >= 1
        finally:
            for conn in dribblers:
                conn.close()


@pytest.mark.process
def test_every_door_refuses_deep_metadata_at_submit() -> None:
    """One check, in the engine's submit: the control socket refuses what HTTP refuses."""
    from serve_support import in_process

    from supervisor.client import Client
    from supervisor.errors import InvalidRequest

    with in_process([echo_backend()]) as (_sup, server, _root):
        client = Client(server.path)
        try:
            with pytest.raises(InvalidRequest, match="metadata nests more than 32"):
                client.submit("echo", b"1", metadata=_nested(40))
            assert client.submit("echo", b"1", metadata=_nested(32))
        finally:
            client.close()
