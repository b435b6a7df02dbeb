"""Another local user takes a model server's port before the server does.

The engine picks a free port for ``${PORT}`` and the server binds it when it is ready to
(ComfyUI or koboldcpp after loading their model: seconds to minutes). Its command line, port
included, is readable by every user (``ps``), so another user can listen there first and
answer the engine's health checks: it would then be sent the requests (prompts, images) and
the server's ``${API_KEY}``. The truth here is the kernel's: the squatter is a real process
of another uid, and what it was sent is what it read from its socket.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from http_support import serve_http
from other_user import needs_other_user, start_as_other_user
from test_model_servers import SERVER, chat, server_backend

MARK = "squat-me-7f3a"

# Waits for the server's command line (every user reads it), listens on its port first, and
# answers every request 200, printing what it was sent.
SQUATTER = r"""
import os, re, socket, sys, time
mark = sys.argv[1]
port = None
while port is None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(mark.encode() in w for w in words) and b"--port" in words:
                port = int(words[words.index(b"--port") + 1])
    time.sleep(0.01)
s = socket.socket()
s.bind(("127.0.0.1", port))
s.listen(16)
print("listening", port, flush=True)
while True:
    c, _ = s.accept()
    data = c.recv(65536)
    print("got", repr(data[:400]), flush=True)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\n\r\n{}")
    c.close()
"""


@pytest.mark.process
@needs_other_user
def test_a_server_port_another_user_took_first_is_sent_no_secret() -> None:
    slow = server_backend("slow", env={"LATE_KEY": "${API_KEY}"})
    # the server binds after 2 s, as one that loads its model first
    slow["command"] = ["sh", "-c", f'sleep 2; exec "$0" "$@"  # {MARK}', sys.executable,
                       str(SERVER), "--port", "${PORT}", "--mode", "ok"]
    squatter = start_as_other_user(SQUATTER, MARK)
    try:
        with serve_http([slow]) as front:
            reply = front.post("/v1/chat/completions", chat("slow"))
            # its server was stopped unasked; the job ran on its next start, on another port
            assert reply.status == 200, reply.body[:300]
            log = [line.text for line in front.sup.snapshot().log]
            said = [t for t in log if "another user (uid 65534) listens on" in t]
            assert said, log[-8:]
            key = next(b.launch.api_key for b in [front.engine.backends["slow"].worker]
                       if b is not None)
    finally:
        squatter.kill()
    out = squatter.communicate(timeout=10)[0]
    assert out.startswith("listening"), out
    # At most a health check that raced its bind, without the key: no job, no secret.
    got = [line for line in out.splitlines() if line.startswith("got")]
    assert all(line.startswith("got b'GET /health ") and "Authorization" not in line
               for line in got), got
    assert key and key not in out


def test_where_the_kernels_tables_cannot_be_read_the_check_stands_aside(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A /proc that hides its TCP tables must not make every server wait for a listener
    nobody can see: the check says it cannot tell (None), and the health checks go on."""
    import socket

    from supervisor import tcp_table
    from supervisor.servers import listener

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        assert listener.listeners_of(url) == {os.getuid()}
        assert listener.listeners_of(url.replace("127.0.0.1", "localhost")) == {os.getuid()}
        assert listener.listeners_of("http://10.1.2.3:80") is None  # not on this host
        monkeypatch.setattr(tcp_table, "use_diag", False)  # (netlink is refused too)
        monkeypatch.setattr(tcp_table, "TABLES", {f: tmp_path / "gone" for f in tcp_table.TABLES})
        assert listener.listeners_of(url) is None


@pytest.mark.process
def test_a_localhost_server_is_sent_to_the_address_its_own_listener_holds() -> None:
    """``localhost`` is 127.0.0.1 and ::1: the server binds one, and the other, on the same
    port, is free for any user. Where localhost resolves to ::1 first (Fedora), a user who
    listened there once the server was ready would get every request and its ${API_KEY}, so
    the engine sends to the address the server's listener holds, never by name."""
    local = server_backend("local", http={"health": "/health", "url": "http://localhost:${PORT}"})
    with serve_http([local]) as front:
        reply = front.post("/v1/chat/completions", chat("local"))
        assert reply.status == 200, reply.body[:300]
        worker = front.engine.backends["local"].worker
        assert worker.url.startswith("http://127.0.0.1:"), worker.url  # (the server's --host)
        assert worker.launch.url == worker.url and worker._link.host == "127.0.0.1"


def test_pinned_names_the_address_of_the_servers_own_listener() -> None:
    import socket

    from supervisor.servers.listener import pinned

    for family, address, shown in ((socket.AF_INET, "127.0.0.1", "127.0.0.1"),
                                   (socket.AF_INET6, "::1", "[::1]")):
        with socket.socket(family) as s:
            try:
                s.bind((address, 0))
            except OSError:  # (no IPv6 here)
                continue
            s.listen()
            port = s.getsockname()[1]
            assert pinned(f"http://localhost:{port}") == f"http://{shown}:{port}"
            assert pinned(f"http://127.0.0.2:{port}") == f"http://127.0.0.2:{port}"
    with socket.socket() as s:  # nobody listens: as it is (nothing is sent before one does)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert pinned(f"http://localhost:{port}") == f"http://localhost:{port}"


@pytest.mark.process
@needs_other_user
def test_pinned_never_names_another_users_listener() -> None:
    import socket

    from supervisor.servers.listener import pinned

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    other = start_as_other_user(
        "import socket, sys, time\ns = socket.socket()\n"
        f"s.bind(('127.0.0.1', {port}))\ns.listen()\nprint('listening', flush=True)\n"
        "time.sleep(60)\n")
    try:
        assert other.stdout is not None and other.stdout.readline().startswith("listening")
        assert pinned(f"http://localhost:{port}") == f"http://localhost:{port}"
    finally:
        other.kill()
        other.communicate(timeout=10)


@pytest.mark.process
def test_a_port_forwarded_into_a_container_is_asked_without_its_key_then_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's published port may be a NAT rule, its listener in another network
    namespace: the kernel lists none here. Such a server is asked its health without its key
    (whoever answers might be anyone), then served; its requests carry the key."""
    from supervisor.servers import handle

    seen: list[str] = []
    monkeypatch.setattr(handle, "listeners_of", lambda url: seen.append(url) or set())
    keyed = server_backend("boxed", env={"SERVER_KEY_SEEN": "${API_KEY}"})
    with serve_http([keyed]) as front:
        reply = front.post("/v1/chat/completions", chat("boxed"))
        assert reply.status == 200, reply.body[:300]
        worker = front.engine.backends["boxed"].worker
        assert worker is not None and worker.launch.api_key and seen
