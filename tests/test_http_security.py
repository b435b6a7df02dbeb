"""Who may use the HTTP front door: tokens, other local users, other machines, browsers.

Attacks are made for real where this machine allows: a request from another uid (a child that
drops to ``nobody`` before connecting; needs root), a forged Host header (DNS rebinding), a
cross-site Origin, a Unix socket peer; "another machine" is a request whose transport says so.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request
from http_support import Front, expecting, serve_http
from other_user import OTHER_UID, needs_other_user, run_as_other_user
from serve_support import cli, echo_backend, make_env, new_root
from spawning import spawns

from supervisor.apispec import METHODS
from supervisor.http import route_table
from supervisor.http.auth import Guard
from supervisor.http.config import (
    TOKEN_ENV,
    HttpConfig,
    HttpConfigError,
    Listen,
    bind_sockets,
    load_http_config,
    parse_listen,
)
from supervisor.http.errors import HttpError
from supervisor.http.peer import Peer
from supervisor.paths import Paths, private_group
from vramtui.serve import engine_config

pytestmark = pytest.mark.timeout(90)
TOKEN = "s3cret-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http([echo_backend()], token=TOKEN, token_source="test", ui=True) as f:
        yield f


def test_reads_are_open_to_the_owner_mutations_need_the_token(front: Front) -> None:
    assert front.get("/v1/backends").status == 200
    r = front.post("/v1/jobs", {"backend": "echo", "input": 1})
    assert r.status == 401 and r.error["code"] == "unauthorized"
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert front.post("/v1/backends/unload").status == 401
    assert front.post("/v1/chat/completions", {"model": "x"}).status == 401
    assert front.get("/unload").status == 401  # llama-swap's GET that changes the engine
    assert front.get("/running").status == 200
    ok = front.post("/v1/jobs", {"backend": "echo", "input": 1}, headers=AUTH)
    assert ok.status == 200 and ok.body == b"1"


def test_every_route_that_changes_the_engine_needs_the_token(front: Front) -> None:
    posts = [r for r in route_table.ROUTES if r.method == "POST"]
    assert {r.api for r in posts if r.api} == {n for n, m in METHODS.items()
                                               if m.mutating} - set(route_table.NOT_ON_HTTP)
    for route in posts:
        path = route.path.replace("{id}", "j-0000000000").replace("{b}", "echo") \
            .replace("{gpu}", "0")
        r = front.post(path, {})
        if route.module == "ollama":  # in the shape Ollama's clients read
            assert r.status == 401 and "bearer token" in r.json()["error"], (route.path, r.body)
        else:
            assert r.status == 401 and r.error["code"] == "unauthorized", (route.path, r.body)


def test_a_wrong_token_is_refused_everywhere_but_health(front: Front) -> None:
    bad = {"Authorization": "Bearer not-the-token-at-all-xxxxxxxx"}
    assert front.get("/v1/backends", headers=bad).status == 401
    assert front.get("/metrics", headers=bad).status == 401
    assert front.get("/healthz", headers=bad).status == 200
    assert front.get("/health", headers=bad).status == 200  # llama-swap's
    assert front.get("/readyz").status == 200


def _as_nobody(port: int, request: bytes) -> bytes:
    """Send ``request`` from a child process running as uid 65534; its raw answer."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, then connect
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(request)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            os.write(wfd, data[:65536])
        finally:
            os._exit(0)
    os.close(wfd)
    out = b""
    while chunk := os.read(rfd, 65536):
        out += chunk
    os.close(rfd)
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_local_user_is_refused_without_the_token(front: Front) -> None:
    plain = (b"GET /v1/backends HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    answer = _as_nobody(front.port, plain)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"uid 65534" in answer and b"not the engine's user" in answer
    with_token = (b"GET /v1/backends HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                  b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
    assert _as_nobody(front.port, with_token).startswith(b"HTTP/1.1 200")


def test_dns_rebinding_and_cross_site_requests_are_refused(front: Front) -> None:
    r = front.get("/v1/backends", headers={"Host": "evil.example:8080"})
    assert r.status == 403 and r.error["code"] == "bad_host"
    r = front.post("/v1/jobs", {"backend": "echo"},
                   headers={**AUTH, "Origin": "http://evil.example"})
    assert r.status == 403 and r.error["code"] == "bad_origin"
    r = front.get("/v1/backends", headers={"Origin": "null"})
    assert r.status == 403
    same = front.get("/v1/backends", headers={"Origin": f"http://127.0.0.1:{front.port}"})
    assert same.status == 200


def test_another_machine_needs_the_token_even_to_read() -> None:
    cfg = HttpConfig(listen=Listen("0.0.0.0", 8080), token=TOKEN)
    guard = Guard(cfg)

    class Transport:
        def get_extra_info(self, name: str) -> object:
            return {"peername": ("192.0.2.7", 40000), "sockname": ("0.0.0.0", 8080),
                    "socket": None}.get(name)

        def is_closing(self) -> bool:
            return False

    def request(headers: dict[str, str], path: str = "/v1/backends") -> object:
        return make_mocked_request("GET", path, headers={"Host": "gpu-box:8080", **headers},
                                   transport=Transport())

    guard = Guard(HttpConfig(listen=Listen("0.0.0.0", 8080), token=TOKEN,
                             allowed_hosts=("gpu-box",)))
    with pytest.raises(HttpError) as err:
        guard.check(request({}))
    assert err.value.status == 401
    decision = guard.check(request(AUTH))
    assert decision.token_ok and decision.peer == Peer(False, None, "192.0.2.7")
    assert guard.check(request({}, "/healthz")).token_ok is False
    with pytest.raises(HttpError) as err:
        Guard(cfg).check(request(AUTH))  # gpu-box is not an allowed host there
    assert err.value.code == "bad_host"


def test_the_browser_dashboard_needs_the_token_then_a_cookie(front: Front) -> None:
    assert front.get("/ui/").status == 401
    first = front.get(f"/ui/?token={TOKEN}&fontsize=20")
    assert first.status == 303 and first.headers["location"] == "/ui/?fontsize=20"
    cookie = first.headers["set-cookie"]
    pair = cookie.split(";", 1)[0]
    assert pair.startswith(front.server.guard.ui_cookie + "=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    again = front.get("/ui/", headers={"Cookie": pair})
    assert again.status == 200 and b"textual" in again.body.lower()
    assert front.get("/v1/backends", headers={"Cookie": pair + "wrong"}).status \
        == 200  # the cookie counts for /ui only: elsewhere it is ignored, not an identity
    ws = front.get("/ui/ws", headers={"Cookie": pair,
                                      "Origin": "http://evil.example", "Upgrade": "websocket",
                                      "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                                      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert ws.status == 403  # WebSocket hijacking from another site


@pytest.mark.process
def test_unix_socket_listener_is_private_and_checks_the_peer(tmp_path: Path) -> None:
    path = Path(f"/tmp/vt-http-{os.getpid()}.sock")
    try:
        with serve_http([echo_backend()], listen=Listen(path=path)) as front:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            conn = http.client.HTTPConnection("localhost", timeout=10)
            conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.sock.connect(str(path))
            conn.request("POST", "/v1/jobs", body=b'{"backend": "echo", "input": 7}',
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == b"7"
            conn.close()
            assert front.server.address == f"unix:{path}"
        assert not path.exists()  # removed when the server closed
    finally:
        if path.exists():
            path.unlink()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")

BIND_V6 = r'''
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
try:
    s.bind(("::1", int(sys.argv[1]))); s.listen(1); print("held")
except OSError as exc:
    print(exc.strerror)
'''


@needs_ipv6
@needs_other_user
def test_localhost_is_held_on_both_its_addresses(front: Front) -> None:
    """The door on 127.0.0.1:P holds [::1]:P too: localhost:P is both (a browser, curl try
    ::1 first), and another user listening there got the owner's token from a client that
    asked localhost, and served a page as this very origin, whose requests, once that user
    let go of [::1]:P, reached the door over 127.0.0.1 from the owner's browser."""
    got = run_as_other_user(BIND_V6, front.port)
    assert got.stdout.strip() == "Address already in use", got.stdout + got.stderr
    conn = http.client.HTTPConnection("::1", front.port, timeout=10)  # and it answers there
    conn.request("GET", "/v1/backends", headers={"Host": f"localhost:{front.port}"})
    assert conn.getresponse().status == 200
    conn.close()


@needs_ipv6
def test_a_start_refuses_when_another_program_holds_localhosts_other_address() -> None:
    squatter = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    squatter.bind(("::1", 0))
    squatter.listen(1)
    port = squatter.getsockname()[1]
    try:
        with pytest.raises(OSError, match=rf"\[::1\]:{port}, the other address of "
                           rf"localhost:{port}, is held by another program"):
            bind_sockets(Listen("127.0.0.1", port))
        with socket.socket() as probe:  # nothing was left bound
            probe.bind(("127.0.0.1", port))
    finally:
        squatter.close()
    socks = bind_sockets(Listen("0.0.0.0", 0))  # a wildcard: localhost reaches it too
    try:
        assert sorted(s.getsockname()[0] for s in socks) == ["0.0.0.0", "::1"]
        assert len({s.getsockname()[1] for s in socks}) == 1
    finally:
        for s in socks:
            s.close()


# -- settings -----------------------------------------------------------------------------

def test_listen_addresses() -> None:
    assert parse_listen("8080") == Listen("127.0.0.1", 8080)
    assert parse_listen("[::1]:9") == Listen("::1", 9)
    assert parse_listen("0.0.0.0:80").loopback is False
    assert parse_listen("localhost:80").loopback is True
    assert parse_listen("unix:/tmp/x.sock").path == Path("/tmp/x.sock")
    for bad in (":8080", "host:port", "1.2.3.4:99999", "", "[::1]8080"):
        with pytest.raises(HttpConfigError):
            parse_listen(bad)


def test_no_token_no_other_machines(tmp_path: Path) -> None:
    with pytest.raises(HttpConfigError, match="set a token"):
        load_http_config(listen="0.0.0.0:8080", environ={})
    cfg = load_http_config(listen="0.0.0.0:8080", environ={TOKEN_ENV: TOKEN})
    assert cfg is not None and cfg.token == TOKEN and TOKEN not in repr(cfg)
    with pytest.raises(HttpConfigError, match="too short"):
        load_http_config(listen="127.0.0.1:1", environ={TOKEN_ENV: "short"})
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o644)
    with pytest.raises(HttpConfigError, match="chmod 600"):
        load_http_config(listen="0.0.0.0:1", token_file=str(token_file), environ={})
    os.chmod(token_file, 0o600)
    cfg = load_http_config(listen="0.0.0.0:1", token_file=str(token_file), environ={})
    assert cfg is not None and cfg.token == TOKEN


def test_the_config_files_http_section(tmp_path: Path) -> None:
    conf = tmp_path / "config.yaml"
    assert load_http_config(config_file=conf, environ={}) is None  # no file: off
    conf.write_text("http:\n  listen: 127.0.0.1:9999\n  max_body: 1MiB\n  heartbeat: 2s\n")
    cfg = load_http_config(config_file=conf, environ={})
    assert cfg is not None and cfg.listen == Listen("127.0.0.1", 9999)
    assert cfg.max_body == 1024 * 1024 and cfg.heartbeat_s == 2.0
    cfg = load_http_config(listen="127.0.0.1:1", config_file=conf, environ={})
    assert cfg is not None and cfg.listen.port == 1  # the flag beats the file
    conf.write_text("http:\n  enabled: false\n")
    assert load_http_config(config_file=conf, environ={}) is None
    conf.write_text("http:\n  lisen: 1\n")
    with pytest.raises(HttpConfigError, match="lisen: unknown setting"):
        load_http_config(config_file=conf, environ={})
    conf.write_text("http: [\n")
    with pytest.raises(HttpConfigError, match="not valid YAML"):
        load_http_config(config_file=conf, environ={})
    # one line each, never a traceback, and never read whole (it was: a UnicodeDecodeError)
    conf.write_bytes(b"http:\n  listen: \xff\n")
    with pytest.raises(HttpConfigError, match="not UTF-8 text"):
        load_http_config(config_file=conf, environ={})
    with conf.open("wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(HttpConfigError, match="over 1,048,576 bytes: is it the right file"):
        load_http_config(config_file=conf, environ={})


def _first_answer(sock: socket.socket) -> bytes:
    """The status line of what the server says first (a 100, or the request's answer)."""
    with sock:
        return sock.recv(65536).split(b"\r\n", 1)[0]


def test_expect_100_is_said_only_after_the_guard_on_every_path(front: Front) -> None:
    """A client that waits for ``100 Continue`` before sending its body is asked for it only
    once the guard let it in: on the door's routes, the dashboard's sub-app, and a path no
    route serves (whose 404 or 405 comes at once: there is no body to ask for)."""
    foreign = {**AUTH, "Origin": "http://evil.example"}
    refusals = [  # (method, path, headers) -> the status that must come first
        ("POST", "/v1/jobs", {}, b"401"),                        # a change without the token
        ("GET", "/ui/", {}, b"401"),                             # the dashboard, no token
        ("GET", "/ui/static/nosuch.js", {}, b"401"),
        ("GET", "/ui/", {"Origin": "http://evil.example"}, b"403"),
        ("POST", "/nosuch", {}, b"401"),                         # no route: the guard first
        ("POST", "/nosuch", foreign, b"403"),                    # a page of another site
        ("GET", "/ui/", foreign, b"403"),
        ("POST", "/v1/jobs", {**AUTH, "Host": "rebound.example"}, b"403"),
        ("POST", "/nosuch", AUTH, b"404"),                       # let in, but nothing there
        ("POST", "/ui/nosuch", AUTH, b"404"),                    # nor in the sub-app
        ("POST", "/healthz", AUTH, b"405"),
        ("POST", "/ui/", AUTH, b"405"),
    ]
    for method, path, headers, status in refusals:
        first = _first_answer(expecting(front.port, path, 10, headers, method=method))
        assert first.startswith(b"HTTP/1.1 " + status), (method, path, headers, first)
    # let in, on a route: the go, then the body, then the answer
    with expecting(front.port, "/v1/jobs", 2, AUTH) as sock:
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"{}")
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")  # (it names no backend)
    with expecting(front.port, f"/ui/?token={TOKEN}", 2, method="GET") as sock:
        answer = sock.recv(65536)  # (the page reads no body: its answer may follow at once)
        assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), answer[:100]
    first = _first_answer(expecting(front.port, "/v1/jobs", 2, AUTH, expect="tea"))
    assert first.startswith(b"HTTP/1.1 417"), first


REWRITE = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"


@needs_other_user
@pytest.mark.process
def test_a_config_file_another_user_could_write_is_not_read() -> None:
    """config.yaml says where the door listens and which Host names it answers: another user
    who can write it reopens DNS rebinding (``allowed_hosts: ["*"]``).  So it is read only as a
    descriptor is: yours (or root's), writable by nobody else, nor its directory."""
    root = new_root()
    os.chmod(root, 0o711)  # (the other user reaches the file, as in a home directory)
    env = make_env(root, [echo_backend()])
    cfg = root / "cfg"
    cfg.mkdir()
    os.chmod(cfg, 0o755)
    conf = cfg / "config.yaml"
    conf.write_text("http:\n  listen: 127.0.0.1:0\n")
    os.chmod(conf, 0o666)  # (made under umask 0)
    attack = 'http:\n  listen: 127.0.0.1:0\n  allowed_hosts: ["*"]\n'
    done = run_as_other_user(REWRITE, conf, attack)
    assert done.returncode == 0 and conf.read_text() == attack, done.stderr
    try:  # the engine refuses to start, one line, before it serves anything
        served = cli(env, "--serve", "--gpus", "sim:8GiB", "--backends",
                     env["VRAMTUI_TEST_BACKENDS"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"vramtui --serve started with {conf}, which another user wrote")
    assert served.returncode == 2, served.stderr
    [line] = served.stderr.strip().splitlines()
    assert f"{conf} is not read: it may be written by others (mode 0666)" in line, line
    assert line.endswith(f"chmod go-w {conf}"), line
    # every reader of the file refuses it the same way (the engine: section, the HTTP door's)
    with pytest.raises(HttpConfigError, match="chmod go-w"):
        engine_config(argparse.Namespace(), Paths.from_env(env), environ={})
    os.chmod(conf, 0o644)
    cfg_ok = load_http_config(config_file=conf, environ={})
    assert cfg_ok is not None and "*" in cfg_ok.allowed_hosts  # its own file, and private
    os.chmod(cfg, 0o775)  # umask 002: group write by the user's own group reads the file
    assert private_group(cfg.stat().st_gid, os.geteuid())  # (root's group, here)
    assert load_http_config(config_file=conf, environ={}) is not None
    os.chown(cfg, -1, OTHER_UID)  # a group with others in it may replace it
    with pytest.raises(HttpConfigError, match=f"its directory may be written by its group "
                       f"\\(mode 0775\\).*chmod go-w {cfg}"):
        load_http_config(config_file=conf, environ={})
    os.chown(cfg, -1, 0)
    os.chmod(cfg, 0o755)
    os.chown(conf, OTHER_UID, OTHER_UID)  # another user's file, whatever its mode
    os.chmod(conf, 0o644)
    with pytest.raises(HttpConfigError, match=f"belongs to uid {OTHER_UID}"):
        load_http_config(config_file=conf, environ={})



@pytest.mark.parametrize(("setting", "said"), [
    ("max_body: abc", "http.max_body: 'abc' is not a size"),
    ("heartbeat: -1", "http.heartbeat: -1 is negative"),
    ("max_streams: -2", "http.max_streams: must be a whole number, 0 or more")])
def test_a_bad_setting_is_named_in_its_error(tmp_path: Path, setting: str, said: str) -> None:
    """(``http.: 'abc' is not a size`` named no setting.)"""
    config = tmp_path / "config.yaml"
    config.write_text(f"http:\n  {setting}\n")
    with pytest.raises(HttpConfigError) as err:
        load_http_config(listen="127.0.0.1:0", config_file=config, environ={})
    assert str(err.value).startswith(f"{config}: {said}"), str(err.value)
