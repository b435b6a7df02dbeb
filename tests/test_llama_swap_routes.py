"""llama-swap's own routes (/health, /running, /unload, /api/models/unload, /logs), answered as
llama-swap answers them, against a real engine with a simulated chat worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from http_support import Front, openai_backends, serve_http
from spawning import spawns
from waiting import wait_until

from supervisor.http import llama_swap_routes

pytestmark = [pytest.mark.timeout(60), pytest.mark.process]


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    backends = [b for b in openai_backends() if b["name"] in ("chat-sim", "slow-chat")]
    for b in backends:  # honest figures: the simulated GPU's context counts too
        b["vram"]["context"] = "256MiB"
    with serve_http(backends, gpus="sim:4GiB") as f:
        yield f


def _chat(front: Front) -> None:
    r = front.post("/v1/chat/completions", {"model": "chat-sim", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status == 200


def _running(front: Front) -> list[dict]:
    r = front.get("/running")
    assert r.status == 200 and r.headers["content-type"].startswith("application/json")
    return r.json()["running"]


def test_health_running_and_unloading_one_model(front: Front) -> None:
    health = front.get("/health")
    assert (health.status, health.body) == (200, b"OK")
    _chat(front)
    (entry,) = _running(front)
    assert entry["model"] == "chat-sim" and entry["state"] == "ready"
    assert "chat.py" in entry["cmd"] and entry["ttl"] == 300 and entry["proxy"] == ""
    r = front.post("/api/models/unload/gpt-4o-mini")  # an alias names it too
    assert (r.status, r.body) == (200, b"OK")
    wait_until(lambda: _running(front) == [], 10, "chat-sim to unload")
    missing = front.post("/api/models/unload/nope", headers={"Accept": "text/plain"})
    assert (missing.status, missing.body) == (404, b"model not found")
    missing = front.post("/api/models/unload/nope")  # (a JSON error, as llama-swap's)
    assert missing.status == 404 and missing.json()["error"]["message"] == "model not found"


def test_unload_all_both_ways(front: Front) -> None:
    _chat(front)
    r = front.get("/unload")
    assert (r.status, r.body) == (200, b"OK")
    wait_until(lambda: _running(front) == [], 10, "every model to unload")
    _chat(front)
    r = front.post("/api/models/unload")
    assert r.status == 200 and r.json() == {"msg": "ok"}
    wait_until(lambda: _running(front) == [], 10, "every model to unload")
    # a page of another site cannot unload everything with an <img src=…/unload>
    cross = front.get("/unload", headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status == 403


def test_a_busy_model_is_unloaded_once_its_answer_is_done(front: Front) -> None:
    # As llama-swap's: the answer under way is not cut, and the model does go after it (it
    # did not: a busy model stayed loaded, though /unload said OK).
    for unload in (lambda: front.get("/unload"),
                   lambda: front.post("/api/models/unload/slow-chat")):
        stream = front.sse("POST", "/v1/chat/completions", {
            "model": "slow-chat", "stream": True, "messages": [{"role": "user",
                                                               "content": "hi"}]})
        first = stream.next()
        assert first is not None
        r = unload()
        assert (r.status, r.body) == (200, b"OK")
        events = [first.data]
        while (event := stream.next()) is not None:
            events.append(event.data)
        assert events[-1] == "[DONE]" and len(events) > 3, events  # its answer whole
        assert all(e["model"] != "slow-chat" for e in _running(front))


def test_logs_and_a_models_log_stream(front: Front) -> None:
    for path in ("/logs", "/log"):
        r = front.get(path)
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
        assert "engine started" in r.body.decode()
    r = front.get("/logs/stream/gpt-4o-mini")
    assert r.status == 307 and r.headers["location"] == "/v1/backends/chat-sim/logs?follow=1"
    assert front.get("/logs/stream/nope").status == 400
    r = front.get("/logs/stream/gpt-4o-mini?no-history")
    assert r.headers["location"] == "/v1/backends/chat-sim/logs?follow=1&lines=0"
    assert "one log per model" in front.get("/logs/stream/upstream").body.decode()


@pytest.mark.parametrize("path", ["/logs/stream", "/logs/stream/proxy?no-history"])
def test_the_engine_log_followed(front: Front, path: str) -> None:
    """``/logs/stream`` (llama-swap's followed log, which its scripts ``curl -N``) was a
    404: its recent lines (not with ``?no-history``), then each line as it is logged."""
    assert front.post("/api/models/unload/chat-sim").status == 200
    conn = front.conn(timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["content-type"].startswith("text/plain")
    if "no-history" not in path:
        assert "engine started" in resp.readline().decode()  # its history first
    assert front.post("/v1/backends/chat-sim/load").status < 300  # logged as it loads
    for _ in range(500):  # (the socket's timeout bounds each read)
        line = resp.readline().decode()
        assert line.endswith("\n"), line
        if "chat-sim:" in line:
            break
    else:
        raise AssertionError("the preload was never logged on the stream")
    assert line[:4].isdigit() and "[info] chat-sim:" in line, line
    conn.close()


def test_an_unload_waits_for_a_model_that_keeps_taking_jobs_only_so_long(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Requests that keep coming keep a model busy: its unload must not wait for a gap that
    # never comes (it did: the answer hung as long as the requests came).
    monkeypatch.setattr(llama_swap_routes, "UNLOAD_WAIT_S", 1.0)
    (chat,) = [b for b in openai_backends(step_s="0.05") if b["name"] == "chat-sim"]
    chat["concurrency"] = 2
    with serve_http([chat], gpus="sim:4GiB") as busy_front:
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                _chat(busy_front)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: _running(busy_front) != [], 10, "chat-sim to be loaded")
            began = time.monotonic()
            r = busy_front.post("/api/models/unload/chat-sim")
            took = time.monotonic() - began
            assert r.status == 409 and b"still ran jobs after 1 s" in r.body, r.body
            assert took < 5, took
            assert [e["model"] for e in _running(busy_front)] == ["chat-sim"]
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        r = busy_front.post("/api/models/unload/chat-sim")  # the requests stopped: it goes
        assert (r.status, r.body) == (200, b"OK")
        assert _running(busy_front) == []
