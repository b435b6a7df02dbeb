"""HTTP model servers (issue 24) that fail the engine in ways of their own, end to end: a real
engine on the simulated GPU, real server processes (``tests/model_server.py``), real clients.

What is checked: a server reached on IPv6 (``[::1]``) gets its port there; a start that
cannot be made (no port can be picked) fails its job with one clear line and the queue goes
on, never leaving the job neither queued nor running.
"""

from __future__ import annotations

from typing import Any

import pytest
from http_support import serve_http
from test_model_servers import _error_text, chat, server_backend
from waiting import wait_until

pytestmark = pytest.mark.process


def _on(host: str, name: str = "v6") -> dict[str, Any]:
    """A server that listens at ``host`` (an IP address), reached there."""
    backend = server_backend(name, args=("--host", host))
    shown = f"[{host}]" if ":" in host else host
    backend["http"]["url"] = f"http://{shown}:${{PORT}}"
    return backend


def test_a_server_on_ipv6_loopback_gets_its_port_there() -> None:
    with serve_http([_on("::1")]) as front:
        reply = front.post("/v1/chat/completions", chat("v6"), timeout=15)
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "tok tok tok tok"


def test_a_start_that_cannot_be_made_fails_its_job_and_the_queue_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An address that was this host's at load and no longer is at a start (injected: no port
    can be picked there): the job fails with one line saying why, it is never left neither
    queued nor running, and the next request is served."""
    from supervisor.servers import launch

    real = launch.free_port
    faults = [OSError(99, "Cannot assign requested address")]

    def failing(host: str) -> int:
        if faults:
            raise faults.pop()
        return real(host)

    monkeypatch.setattr(launch, "free_port", failing)
    with serve_http([server_backend("a")]) as front:
        reply = front.post("/v1/chat/completions", chat("a"), timeout=15)
        message = _error_text(reply.body)
        wanted = "cannot start a: no port for ${PORT} can be picked at 127.0.0.1"
        assert reply.status >= 500 and wanted in message, message
        assert "Cannot assign requested address" in message, message
        assert "\n" not in message and "Traceback" not in message
        assert front.get("/v1/jobs?state=active").json()["data"] == []
        assert front.post("/v1/chat/completions", chat("a"), timeout=15).status == 200


@pytest.mark.parametrize("stream", [True, False])
def test_a_server_hung_mid_answer_fails_its_job_at_the_idle_limit(stream: bool) -> None:
    """Its health still answers (a ping finds it alive), its answer stops coming: the job fails
    once it was silent for ``timeouts.idle``, its connection closed (the server frees the
    slot), and the job queued behind it (one at a time) runs."""
    backend = server_backend("stall", mode="stall", concurrency=1,
                             timeouts={"idle": "0.5s", "start": "20s", "stop_grace": "3s"})
    with serve_http([backend]) as front:
        first = front.post("/v1/jobs", {"backend": "stall", "input": chat("stall", stream)},
                           headers={"Prefer": "respond-async"}).json()["id"]
        second = front.post("/v1/jobs", {"backend": "stall", "input": chat("stall", stream)},
                            headers={"Prefer": "respond-async"}).json()["id"]
        assert front.wait_state(first, "failed", timeout=10) == "failed"
        error = front.get(f"/v1/jobs/{first}").json()["error"]
        assert "it sent nothing for 0.5 s (timeouts.idle)" in error, error
        # The second ran (and hung the same way): the queue was not held behind the first.
        assert front.wait_state(second, "failed", timeout=10) == "failed"
        wait_until(lambda: front.get("/upstream/stall/slots").json() == [
            {"id": i, "is_processing": False} for i in range(4)], 10, "its slots to be free")
        assert front.get("/v1/backends/stall").json()["state"] in ("ready", "idle")


def test_a_header_the_server_repeats_keeps_every_value() -> None:
    # Two X-Tag lines: collapsed into a dict, the last was all the client saw. Two
    # Cache-Control lines, one spelt in lowercase: one header, as HTTP reads them.
    with serve_http([server_backend("llama")]) as front:
        conn = front.conn()
        try:
            conn.request("GET", "/upstream/llama/twice")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"twice")
            assert resp.msg.get_all("X-Tag") == ["a, b"]
            assert resp.msg.get_all("Cache-Control") == ["no-cache, no-store"]
        finally:
            conn.close()
