"""The front door's event hub: a stream of one job's events is offered that job's events only
(a chunk costs the hub the streams that want it, not every open stream); a stream of every
event (the /v1/events feed) is offered each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from supervisor.events import EngineEvent, EventHub
from supervisor.http.sse import Hub, Item, Stream


def _stream(hub: Hub, seen: list[str], job_id: str | None) -> Stream:
    def wants(item: Item) -> bool:
        seen.append(item.event.job_id or item.event.kind)
        return False  # (offered, not taken: the stream's request is never touched)

    request: Any = None
    return Stream(hub, request, wants=wants, encode=lambda item: None,
                  on_lag=lambda n, seq: (b"", False), heartbeat_s=60, buffer_limit=1 << 20,
                  job_id=job_id)


def test_a_jobs_stream_is_offered_its_jobs_events_only() -> None:
    events = EventHub()
    hub = Hub(SimpleNamespace(events=events))  # type: ignore[arg-type]
    hub.start()
    seen_a: list[str] = []
    seen_b: list[str] = []
    seen_all: list[str] = []
    a, b, every = _stream(hub, seen_a, "a"), _stream(hub, seen_b, "b"), \
        _stream(hub, seen_all, None)
    for stream in (a, b, every):
        hub.add(stream)
    for job_id in ("a", "b", "c", "a"):
        events.publish(EngineEvent("chunk", 0.0, job_id=job_id, data=b"x"))
    events.publish(EngineEvent("log", 0.0, message="hello"))
    assert seen_a == ["a", "a"] and seen_b == ["b"]
    assert seen_all == ["a", "b", "c", "a", "log"]
    assert set(hub.streams) == {a, b, every}
    hub.discard(a)
    events.publish(EngineEvent("chunk", 0.0, job_id="a", data=b"x"))
    assert seen_a == ["a", "a"] and set(hub.streams) == {b, every}
    hub.close()
    assert hub.closed and b.wake.is_set() and every.wake.is_set()
