"""Another local user takes a model server's port before the server does.

The engine picks a free port for ``${PORT}`` and the server binds it when it is ready to
(ComfyUI or koboldcpp after loading their model: seconds to minutes). Its command line, port
included, is readable by every user (``ps``), so another user can listen there first and
answer the engine's health checks: it would then be sent the requests (prompts, images) and
the server's ``${API_KEY}``. The truth here is the kernel's: the squatter is a real process
of another uid, and what it was sent is what it read from its socket.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from http_support import serve_http
from other_user import needs_other_user, start_as_other_user
from test_model_servers import SERVER, chat, server_backend
from waiting import wait_until

pytestmark = [pytest.mark.process, needs_other_user]

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


def test_a_server_port_another_user_took_first_is_sent_nothing() -> None:
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
            assert said and "nothing was sent there" in said[0], log[-8:]
    finally:
        squatter.kill()
    out = squatter.communicate(timeout=10)[0]
    assert out.startswith("listening"), out
    assert "got" not in out, f"the squatter was sent: {out}"


def test_the_owners_own_listener_is_the_server() -> None:
    """The check reads the kernel's table of listeners: the server's own socket passes."""
    from supervisor.servers.listener import listener_uids

    with serve_http([server_backend("own")]) as front:
        assert front.post("/v1/chat/completions", chat("own")).status == 200
        port = int(front.engine.backends["own"].worker.url.rsplit(":", 1)[1])
        wait_until(lambda: listener_uids("127.0.0.1", port), 5, "its listener")
        import os

        assert listener_uids("127.0.0.1", port) == {os.getuid()}
    assert Path(SERVER).exists()
