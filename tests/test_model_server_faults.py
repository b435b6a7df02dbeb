"""HTTP model servers (issue 24) that fail the engine in ways of their own, end to end: a real
engine on the simulated GPU, real server processes (``tests/model_server.py``), real clients.

What is checked: a server reached on IPv6 (``[::1]``) gets its port there; a start that
cannot be made (no port can be picked) fails its job with one clear line and the queue goes
on, never leaving the job neither queued nor running; an answer silent past
``timeouts.idle`` fails its job; two in a row, nothing generated between, while its health
answers: the server stopped answering, and is killed (its process gone, as /proc says) and
started again by the next request, its silent job retried once when nothing of it was sent;
a slow request among answered ones is never taken for that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from http_support import serve_http
from test_model_servers import _error_text, chat, server_backend, server_pids
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


def _async(front: Any, backend: str, body: dict[str, Any]) -> str:
    return str(front.post("/v1/jobs", {"backend": backend, "input": body},
                          headers={"Prefer": "respond-async"}).json()["id"])


def _pid_of(answer: dict[str, Any]) -> int:
    return int(answer["system_fingerprint"].removeprefix("pid-"))


@pytest.mark.parametrize("stream", [True, False])
def test_a_server_that_stopped_answering_is_killed_and_the_next_request_starts_it(
        stream: bool, tmp_path: Path) -> None:
    """Its generation stuck, its health (and a stream's head) still answered: the first job
    fails at the idle limit, the second's silence makes two in a row, and the server is
    killed (its old process gone) with one line saying why. The second job, nothing of it
    sent to its client yet, runs again on the new server; one whose client was streamed
    the server's head fails with that line. The next request starts a new server."""
    backend = server_backend("qwen", mode="stuck", concurrency=1,
                             args=("--once-file", str(tmp_path / "stuck")),
                             timeouts={"idle": "0.5s", "start": "20s", "stop_grace": "3s"})
    with serve_http([backend]) as front:
        first = _async(front, "qwen", chat("qwen", stream))
        old = wait_until(lambda: front.get("/v1/backends/qwen").json()["pid"], 10,
                         "its server to start")
        said = (f"qwen stopped answering: 2 requests in a row silent for 0.5 s "
                f"(timeouts.idle) while /health answered; killed its server (pid {old}), "
                "the backend restarts on its next job")
        if stream:  # (its head comes once the first failed and it went to the server)
            sse = front.sse("POST", "/v1/chat/completions", chat("qwen", True))
            second = sse.headers["x-vramtui-job"]
            events = []
            while (event := sse.next()) is not None:
                events.append(event.data)
            sse.conn.close()
            assert any(said in data for data in events), events
            assert front.job_state(second) == "failed"
        else:  # retried once, on the new server
            second = _async(front, "qwen", chat("qwen"))
            assert front.wait_state(second, "succeeded", "failed", timeout=20) == "succeeded"
            new = _pid_of(front.get(f"/v1/jobs/{second}/result").json())
            assert new != old
        assert front.wait_state(first, "failed", timeout=10) == "failed"
        error = front.get(f"/v1/jobs/{first}").json()["error"]
        assert "it sent nothing for 0.5 s (timeouts.idle)" in error, error
        assert "stopped answering" not in error, error  # one silence is not enough
        wait_until(lambda: not Path(f"/proc/{old}").exists(), 10, "its old process to go")
        log = [line.text for line in front.sup.snapshot().log
               if line.text.startswith("qwen stopped answering")]
        assert log == [said], log
        reply = front.post("/v1/chat/completions", chat("qwen"), timeout=20)
        assert reply.status == 200, reply.body
        assert _pid_of(reply.json()) != old
        assert server_pids(front.root) == {_pid_of(reply.json())}


def test_a_slow_request_among_answered_ones_never_kills_its_server() -> None:
    """Two slots, one streaming all along: the requests silent past the idle limit meanwhile,
    two in a row with no answer ended between, are slow requests, not a stuck server (the
    other slot's answer moved during their silence): the server is never killed."""
    backend = server_backend("odd", mode="odd", concurrency=2,
                             args=("--tokens", "400", "--token-s", "0.05"),
                             timeouts={"idle": "0.5s", "start": "20s", "stop_grace": "3s"})
    silent = {"model": "odd", "messages": [{"role": "user", "content": "silent"}]}
    with serve_http([backend]) as front:
        talking = _async(front, "odd", chat("odd", True))  # 20 s of chunks, 50 ms apart
        slow = [_async(front, "odd", silent) for _ in range(2)]  # one after the other
        pid = wait_until(lambda: front.get("/v1/backends/odd").json()["pid"], 10,
                         "its server to start")
        for job in slow:
            assert front.wait_state(job, "failed", timeout=10) == "failed"
            error = front.get(f"/v1/jobs/{job}").json()["error"]
            assert "it sent nothing for 0.5 s" in error, error
        assert front.job_state(talking) == "running"  # (its answer moved all along)
        assert front.get("/v1/backends/odd").json()["pid"] == pid
        assert not [line.text for line in front.sup.snapshot().log
                    if "stopped answering" in line.text]
        assert server_pids(front.root) == {pid}
        front.post(f"/v1/jobs/{talking}/cancel")
        assert front.wait_state(talking, "cancelled", timeout=10) == "cancelled"


def test_a_request_sent_to_a_slot_its_server_has_not_freed_yet_is_asked_again() -> None:
    """Two slots, two streams, a third request queued; the first client goes: the engine
    counts its slot free at once and sends the third, but a server that refuses when full
    (503, as koboldcpp does) may not have freed it yet, and the third failed with that 503
    (13 rounds in 20, a helper found). A 503 is asked again once, 0.25 s later."""
    import socket

    backend = server_backend("two", args=("--token-s", "0.05", "--tokens", "30", "--slots",
                                          "2"), concurrency=2)

    def ask(stream: bool) -> socket.socket:
        body = json.dumps(chat("two", stream=stream)).encode()
        sock = socket.create_connection(("127.0.0.1", front.port), timeout=30)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                     b"Connection: close\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (front.port, len(body)) + body)
        return sock

    def answer(sock: socket.socket) -> bytes:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        return data

    with serve_http([backend]) as front:
        for _ in range(4):
            first, second = ask(True), ask(True)
            wait_until(lambda: len(front.get("/v1/jobs?state=running&backend=two")
                                   .json()["data"]) == 2, 10, "both streams to run")
            third = ask(False)
            wait_until(lambda: front.get("/v1/jobs?state=queued&backend=two").json()["data"],
                       10, "the third request to wait")
            first.close()  # its slot: free for the engine now, for the server a bit later
            reply = answer(third)
            assert reply.startswith(b"HTTP/1.1 200 "), reply[:300]
            answer(second)
            wait_until(lambda: not front.get("/v1/jobs?state=running&backend=two")
                       .json()["data"], 10, "the streams to end")


def test_a_load_whose_request_went_gives_way_to_a_request_that_needs_its_room() -> None:
    """A request starts a server that takes long to load, and its client goes while it loads:
    the load is for nobody now. A request for another server that cannot sit beside it is not
    kept waiting for that load: the load is given up (its process gone, as /proc says) and the
    other server starts at once. Nobody else wanting the room, a load for nobody goes on."""
    slow = server_backend("slow", 5000, args=("--load-s", "60"),
                          timeouts={"start": "90s", "stop_grace": "3s"})
    with serve_http([slow, server_backend("quick", 5000)]) as front:
        conn = front.conn(timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(chat("slow")).encode(),
                     headers={"Content-Type": "application/json"})
        job = wait_until(lambda: next(iter(front.get("/v1/jobs?state=active").json()["data"]),
                                      None), 10, "the slow request's job")
        wait_until(lambda: server_pids(front.root), 10, "the slow server to be loading")
        conn.close()  # its client goes while it loads
        front.wait_state(job["id"], "cancelled")
        loading = server_pids(front.root)
        assert front.engine.backends["slow"].worker is not None  # nobody else wants the room
        reply = front.post("/v1/chat/completions", chat("quick"), timeout=20)
        assert reply.status == 200, reply.body
        assert not loading & server_pids(front.root)  # the load for nobody was given up
        ends = front.get("/v1/jobs?state=succeeded").json()["data"]
        assert [j["backend"] for j in ends] == ["quick"]
