"""A front door nobody follows costs the engine no event: requests run as jobs, but no job,
worker or log event is built for the door's replay ring until an event feed opens; once one
has, its events are numbered and a client that reconnects within the linger is replayed.

Against a real engine with a real echo worker, over real HTTP; what the engine builds is read
from its event hub (``wants``), what the door numbered from ``/v1/stats``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from http_support import Front, echo_backend, openai_backends, serve_http
from spawning import spawns

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
@spawns
def front() -> Iterator[Front]:
    with serve_http([echo_backend()]) as f:
        yield f


def _seq(front: Front) -> int:
    return int(front.get("/v1/stats").json()["event_seq"])


def test_requests_nobody_follows_build_no_event_and_a_feed_is_replayed_after_it(
        front: Front) -> None:
    events = front.engine.events
    before = _seq(front)
    for i in range(3):
        r = front.post("/v1/jobs", {"backend": "echo", "input": i})
        assert r.status == 200, r.body
    assert not events.wants("job") and not events.wants("worker") and not events.wants("log")
    assert _seq(front) == before  # (nothing heard, nothing numbered)

    feed = front.sse("GET", "/v1/events?kinds=job")
    first = feed.next()
    assert first is not None and first.event == "snapshot"
    assert events.wants("job")
    job_id = front.post("/v1/jobs", {"backend": "echo", "input": "seen"}).headers[
        "x-vramtui-job"]
    while (ev := feed.next()) is not None and not (
            ev.event == "job" and ev.json()["job"]["id"] == job_id
            and ev.json()["job"]["state"] == "succeeded"):
        pass
    assert ev is not None
    mark = ev.id
    feed.close()
    later = front.post("/v1/jobs", {"backend": "echo", "input": "missed"}).headers[
        "x-vramtui-job"]
    again = front.sse("GET", "/v1/events?kinds=job", headers={"Last-Event-ID": str(mark)})
    ev = again.next()
    again.close()
    # within the linger: what happened while it was away is replayed, not a snapshot
    assert ev is not None and ev.event == "job" and ev.json()["job"]["id"] == later


def test_an_id_this_door_never_gave_gets_a_snapshot_and_odd_digits_a_clear_answer(
        front: Front) -> None:
    feed = front.sse("GET", "/v1/events?kinds=job")
    assert (first := feed.next()) is not None and first.event == "snapshot"
    now = int(first.id)
    feed.close()
    # from its future (a number it has not given), from an earlier run of the server (ids
    # of a run start where the last could not have reached), and not a number at all
    for query in (f"last_event_id={now + 1000}", "last_event_id=12",
                  "last_event_id=%C2%B2", "last_event_id=%D9%A3"):  # (², and Arabic 3)
        again = front.sse("GET", f"/v1/events?kinds=job&{query}")
        ev = again.next()
        again.close()
        assert ev is not None and ev.event == "snapshot", (query, ev)
    r = front.get("/v1/backends/echo/logs?lines=%C2%B2")
    assert r.status == 400 and "whole number" in r.body.decode(), r.body


def test_a_stream_that_ended_with_its_job_leaves_nothing_to_resume(front: Front) -> None:
    events = front.engine.events
    reader = front.sse("POST", "/v1/jobs", {"backend": "echo", "input": {"stream": 2}})
    told = [ev.event for ev in iter(reader.next, None)]  # (read to its end)
    reader.close()
    assert told[-1] == "state", told
    front.post("/v1/jobs", {"backend": "echo", "input": 1})  # (the next event lets go)
    assert not events.wants("job") and not events.wants("log")


@pytest.mark.process
def test_a_job_stream_resumed_numbers_its_chunks_as_the_job_does() -> None:
    with serve_http(openai_backends()) as front:
        body = {"backend": "slow-chat", "stream": True,
                "input": {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                          "stream": True}}
        job = front.post("/v1/jobs", body, headers={"Prefer": "respond-async"}).json()["id"]
        reader = front.sse("GET", f"/v1/jobs/{job}/events")
        got: list[Any] = []
        while sum(e.event == "chunk" for e in got) < 3:
            ev = reader.next()
            assert ev is not None, got
            got.append(ev)
        reader.close()
        front.wait_state(job, "succeeded")
        again = front.sse("GET", f"/v1/jobs/{job}/events", headers={"Last-Event-ID": got[-1].id})
        resumed = [e.json()["index"] for e in iter(again.next, None) if e.event == "chunk"]
        again.close()
        whole = front.sse("GET", f"/v1/jobs/{job}/events")  # a fresh stream: every chunk
        total = sum(e.event == "chunk" for e in iter(whole.next, None))
        whole.close()
        assert total > 3 and resumed == list(range(3, total)), (resumed, total)
