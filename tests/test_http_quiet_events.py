"""A front door nobody follows costs the engine no event: requests run as jobs, but no job,
worker or log event is built for the door's replay ring until an event feed opens; once one
has, its events are numbered and a client that reconnects within the linger is replayed.

Against a real engine with a real echo worker, over real HTTP; what the engine builds is read
from its event hub (``wants``), what the door numbered from ``/v1/stats``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_support import Front, echo_backend, serve_http
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
