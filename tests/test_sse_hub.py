"""The front door's event hub: a stream of one job's events is offered that job's events only
(a chunk costs the hub the streams that want it, not every open stream); a stream of every
event (the /v1/events feed) is offered each.  A hub that nobody follows stops listening after
its linger, or as its last stream leaves when there is nothing to resume (the engine then
builds no event for it: a request's own job events, once its answer streamed), and a client
that resumes from before that is told to take a snapshot, never replayed a history with a
hole in it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.events import EngineEvent, EventHub
from supervisor.http import sse
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


def test_a_hub_nobody_follows_hears_nothing_and_resumes_from_a_hole_with_a_snapshot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(sse, "monotonic", lambda: now[0])
    events = EventHub()
    hub = Hub(SimpleNamespace(events=events), first_id=0)  # type: ignore[arg-type]
    assert not events.wants("job")  # nobody follows: the engine builds no event for it
    feed = _stream(hub, [], None)
    feed.resumable = True  # (the event feeds': numbered, resumed with Last-Event-ID)
    hub.add(feed)
    assert events.wants("job") and events.wants("chunk")
    events.publish(EngineEvent("job", 0.0, job_id="a"))
    events.publish(EngineEvent("job", 0.0, job_id="a"))
    assert hub.seq == 2 and [i.id for i in hub.since(0) or []] == [1, 2]
    assert hub.since(2) == [] and hub.since(3) is None  # (3: none given yet, no replay)
    hub.discard(feed)
    now[0] += sse.LINGER_S - 1
    events.publish(EngineEvent("job", 0.0, job_id="b"))  # in its linger: kept to replay
    assert [i.id for i in hub.since(2) or []] == [3]
    now[0] += 2
    events.publish(EngineEvent("job", 0.0, job_id="c"))  # past it: let go, not kept
    assert not events.wants("job") and not events.wants("chunk")
    for last in (0, 2, 3):
        assert hub.since(last) is None  # (a hole since: a snapshot, not a replay)
    relay = _stream(hub, [], "d")  # an answer streamed: nothing to resume after it
    hub.add(relay)
    assert events.wants("job")
    events.publish(EngineEvent("job", 0.0, job_id="d"))
    assert [i.id for i in hub.since(hub.seq - 1) or []] == [hub.seq] and hub.since(3) is None
    hub.discard(relay)
    assert not events.wants("job")  # (no linger after it: let go at once, no event waited for)
    events.publish(EngineEvent("job", 0.0, job_id="e"))
    assert not events.wants("job")
    ended = _stream(hub, [], "f")
    ended.resumable = ended.finished = True  # a job's events, streamed to the job's end
    hub.add(ended)
    hub.discard(ended)
    assert not events.wants("job")  # (nothing left to resume: no linger)
    hub.close()


def test_a_hubs_numbers_go_on_from_those_of_an_earlier_run() -> None:
    events = EventHub()
    before = Hub(SimpleNamespace(events=events))  # type: ignore[arg-type]
    feed = _stream(before, [], None)
    before.add(feed)
    for _ in range(3):  # (numbers start at microseconds since the epoch: each event takes more)
        events.publish(EngineEvent("job", 0.0, job_id="a"))
    before.close()
    after = Hub(SimpleNamespace(events=EventHub()))  # type: ignore[arg-type]
    assert after.seq > before.seq and after.since(before.seq) is None  # (a snapshot)


def test_a_subscription_after_the_engine_closed_is_told_so_at_once() -> None:
    """A follower that comes after the engine's last event (a stream opened while the door
    closes) would otherwise wait for an event that never comes."""
    events = EventHub()
    events.close()
    late = events.subscribe(maxsize=4)
    told = late.get(timeout=1)  # (without: None, after the second)
    assert told is not None and told.kind == "closed"
    hub = Hub(SimpleNamespace(events=events))  # type: ignore[arg-type]
    feed = _stream(hub, [], None)
    hub.add(feed)
    assert hub.closed and feed.wake.is_set()
