"""Attacks on the control socket: pipelining, half frames, silence, floods, big results.

Each test plays a hostile client with raw frames against a real engine and its real server,
and checks the server's own accounting of what it holds (write buffers, bytes being received,
connections) — a figure the attack cannot fake — and that an honest client still gets in.
Memory and timings of the same attacks are measured by ``bench/hostile.py``.
"""

from __future__ import annotations

import json
import logging
import struct
import time

import msgpack
import pytest
from engine_support import ROOT
from serve_support import RawConn, echo_backend, in_process, request
from waiting import wait_until

from supervisor.client import Client
from supervisor.control.codec import snapshot_to_wire
from supervisor.control.errors import EngineBusy, TooManyConnections
from supervisor.control.limits import ControlLimits
from supervisor.control.reader import Busy, RequestReader
from supervisor.engine import EngineConfig
from supervisor.errors import VramtuiError
from supervisor.jobs import JobState
from worker_sdk.protocol import HEADER, DataType, Message, MessageType

HOSTILE = ROOT / "tests" / "workers" / "hostile.py"
FAST = dict(sweep_s=0.05)


def hostile_backend() -> dict[str, object]:
    return {"name": "hostile", "script": str(HOSTILE),
            "vram": {"weights": "0MiB", "activation": "16MiB"},
            "timeouts": {"stop_grace": "3s"}}


def backends() -> list[dict[str, object]]:
    return [echo_backend(), hostile_backend()]


def header(length: int) -> bytes:
    return HEADER.pack(length, int(MessageType.REQUEST), int(DataType.DEFAULT), 0)


def stats_of(server: object) -> dict[str, object]:
    return server.stats()  # type: ignore[attr-defined, no-any-return]


# -- the reader, alone ----------------------------------------------------------------------------


def test_a_big_frame_over_the_budget_is_skipped_not_held() -> None:
    budget = {"left": 300_000}

    def admit(n: int) -> bool:
        if n > budget["left"]:
            return False
        budget["left"] -= n
        return True

    def release(n: int) -> None:
        budget["left"] += n

    first = RequestReader(1 << 20, admit=admit, release=release)
    second = RequestReader(1 << 20, admit=admit, release=release)
    big = request(7, "submit", backend="echo", payload=b"x" * 200_000)
    bigger = request(8, "submit", backend="echo", payload=b"y" * 250_000)
    assert first.feed(big[:100_000]) == []  # half of it: the budget it holds stays held
    assert first.held == len(big) - 12
    stream = request(1, "ping") + bigger + request(9, "ping")
    items: list[object] = []
    for at in range(0, len(stream), 7_001):  # odd cuts: headers straddle chunks
        items += second.feed(stream[at : at + 7_001])
        assert second.held == 0 and budget["left"] >= 0
    kinds = [type(i) for i in items]
    assert kinds == [Message, Busy, Message], kinds
    assert [i.id for i in items if isinstance(i, Message)] == [1, 9]
    busy = items[1]
    assert isinstance(busy, Busy) and busy.msg_id == 8 and busy.length == len(bigger) - 12
    done = first.feed(big[100_000:])
    assert [i.id for i in done if isinstance(i, Message)] == [7]
    assert budget["left"] == 300_000  # all given back
    assert not first.partial and not second.partial
    first.feed(header(len(bigger) - 12))
    assert first.held == len(bigger) - 12  # admitted once the budget is free
    first.close()
    assert budget["left"] == 300_000


def test_announcing_a_big_frame_allocates_nothing_until_admitted() -> None:
    reader = RequestReader(64 << 20, admit=lambda n: False)
    assert reader.feed(header(60 << 20) + b"\x85") == []  # refused: skipped as it comes
    assert reader.partial and reader.held == 0
    assert len(reader.get_buffer()) <= 256 * 1024  # a small scratch buffer, never 60 MiB


# -- pipelining and not reading -------------------------------------------------------------------


@pytest.mark.process
def test_a_client_that_pipelines_and_never_reads_gets_no_more_than_one_reply_buffered(
) -> None:
    with in_process(backends(), subscriber_buffer=64 * 1024) as (sup, server, _root):
        raw = RawConn(sup.paths.control_socket, rcvbuf=4096)
        raw.hello()
        one = Client(sup.paths.control_socket)
        for _ in range(10):  # results that a snapshot with data_limit=-1 carries, all of them
            one.submit_wait("echo", b"r" * (64 * 1024))
        reply_size = len(msgpack.packb(snapshot_to_wire(sup.snapshot())))  # one reply's size
        assert reply_size > 640 * 1024
        burst = b"".join(request(i, "snapshot", data_limit=-1) for i in range(1, 101))
        assert len(burst) < 12 * 1024
        raw.send(burst)
        wait_until(lambda: any(c["paused"] for c in stats_of(server)["clients"]), 10,
                 "the server to stop answering the client that does not read")
        time.sleep(0.3)  # give a broken server the time to answer the other 99
        st = stats_of(server)
        stuck = max(st["clients"], key=lambda c: c["write_buffer"])
        assert stuck["write_buffer"] <= 64 * 1024 + reply_size, st  # 100 would be 64 MiB
        assert st["requests"] < 60, st  # the rest wait in the socket, not in the engine
        assert one.ping() < 5  # the engine serves others meanwhile
        raw.sock.settimeout(30)
        ids = [raw.recv().id for _ in range(100)]  # reading again: every answer, in order
        assert ids == list(range(1, 101))
        raw.close()
        one.close()


@pytest.mark.process
def test_a_client_that_never_reads_is_cut_off_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    limits = ControlLimits(write_high=16 * 1024, stall_timeout_s=0.3, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        raw = RawConn(sup.paths.control_socket, rcvbuf=4096)
        raw.hello()
        raw.send(b"".join(request(i, "snapshot") for i in range(1, 200)))
        wait_until(lambda: stats_of(server)["cut_off"] >= 1, 10, "the stalled client cut off")
        assert stats_of(server)["connections"] == 0
        assert any("has not read its replies" in r.getMessage() for r in caplog.records)
        assert Client(sup.paths.control_socket).ping() < 5
        raw.close()


# -- half frames ----------------------------------------------------------------------------------


@pytest.mark.process
def test_half_sent_big_frames_share_one_budget_and_time_out() -> None:
    limits = ControlLimits(max_receiving=2 << 20, frame_timeout_s=0.5, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        conns = []
        for _ in range(6):  # each announces 1 MiB and sends 100 bytes of it
            raw = RawConn(sup.paths.control_socket)
            raw.hello()
            raw.send(header(1 << 20) + b"\x85" + b"z" * 99)
            conns.append(raw)
        wait_until(lambda: stats_of(server)["receiving"] == 2 << 20, 10, "two frames admitted")
        assert stats_of(server)["receiving"] <= limits.max_receiving
        c = Client(sup.paths.control_socket)
        assert c.ping() < 5  # small requests are never held up by the budget
        # An honest large request meanwhile is told to retry, and its connection goes on.
        with pytest.raises(EngineBusy, match="try again"):
            c.submit("echo", b"p" * (1 << 20))
        assert c.submit_wait("echo", b"small").state is JobState.SUCCEEDED
        wait_until(lambda: stats_of(server)["cut_off"] >= 6, 10, "the half frames cut off")
        assert stats_of(server)["receiving"] == 0
        assert c.submit_wait("echo", b"q" * (1 << 20)).state is JobState.SUCCEEDED
        for raw in conns:
            raw.close()
        c.close()


@pytest.mark.process
def test_a_frame_exactly_at_the_limit_is_taken_and_one_byte_more_is_refused() -> None:
    limit = 256 * 1024
    with in_process(backends(), max_request=limit) as (sup, _server, _root):
        raw = RawConn(sup.paths.control_socket)
        raw.hello()
        for msg_id, extra in ((3, 0), (4, 1)):
            body = request(msg_id, "ping", pad=b"")
            pad = limit - (len(body) - 12)  # grow an argument until the body is at the limit
            frame = request(msg_id, "ping", pad=b"a" * (pad - 3 + extra))
            (length,) = struct.unpack_from(">Q", frame)
            assert length == limit + extra, (length, limit)
            raw.send(frame)
            reply = raw.recv()
            assert reply.id == msg_id
            if extra:
                assert reply.payload["type"] == "RequestTooLarge"
            else:
                assert reply.type == MessageType.RESPONSE, reply.payload
        raw.close()


# -- silent clients and connection slots ----------------------------------------------------------


@pytest.mark.process
def test_silent_clients_give_way_and_time_out_so_the_owner_always_gets_in() -> None:
    limits = ControlLimits(max_connections=8, idle_timeout_s=0.5, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        silent = [RawConn(sup.paths.control_socket) for _ in range(8)]
        for raw in silent:
            raw.hello()
        t0 = time.monotonic()
        assert Client(sup.paths.control_socket).ping() < 5  # one of them gave way
        assert time.monotonic() - t0 < 5
        assert stats_of(server)["evicted"] >= 1
        wait_until(lambda: stats_of(server)["connections"] <= 1, 10, "idle clients closed")
        assert stats_of(server)["idle_closed"] >= 6
        for raw in silent:
            raw.close()


@pytest.mark.process
def test_subscriptions_never_take_the_last_slots() -> None:
    limits = ControlLimits(max_connections=8, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        reserve = stats_of(server)["owner_reserve"]
        assert reserve == 2
        subs = []
        for i in range(8 - reserve):
            raw = RawConn(sup.paths.control_socket)
            raw.hello()
            raw.send(request(2, "subscribe"))
            assert raw.recv().type == MessageType.RESPONSE, i
            subs.append(raw)
        extra = RawConn(sup.paths.control_socket)
        extra.hello()
        extra.send(request(2, "subscribe"))
        refused = extra.recv()
        assert refused.payload["type"] == "TooManyConnections"
        assert "kept for short requests" in refused.payload["error"]
        extra.close()
        c = Client(sup.paths.control_socket)
        assert c.ping() < 5
        with pytest.raises(TooManyConnections):  # refused before the job is accepted
            c.submit_wait("echo", b"x")
        assert not [j for j in c.snapshot().recent if j.backend == "echo"]
        for raw in subs:
            raw.close()
        c.close()


@pytest.mark.process
def test_when_every_slot_is_busy_a_newcomer_is_refused_and_that_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    limits = ControlLimits(max_connections=4, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        held = []
        for _ in range(4):  # busy: each is in the middle of a frame
            raw = RawConn(sup.paths.control_socket)
            raw.hello()
            raw.send(header(1000) + b"\x85")
            held.append(raw)
        wait_until(lambda: stats_of(server)["connections"] == 4, 10, "four busy connections")
        late = RawConn(sup.paths.control_socket)
        reply = late.hello()
        assert reply.type == MessageType.ERROR
        assert reply.payload["type"] == "TooManyConnections"
        assert any("all of them busy" in r.getMessage() for r in caplog.records)
        for raw in [*held, late]:
            raw.close()


# -- results ----------------------------------------------------------------------------------


@pytest.mark.process
def test_job_events_carry_no_result_and_wait_does() -> None:
    with in_process(backends()) as (sup, _server, _root):
        c = Client(sup.paths.control_socket)
        sub = c.subscribe(kinds=["job"])
        payload = b"r" * (512 * 1024)
        view = c.submit_wait("echo", payload)
        assert view.state is JobState.SUCCEEDED and view.data == payload
        events = []
        while (ev := sub.get(2)) is not None:
            if ev.job is not None and ev.job.id == view.id:
                events.append(ev.job)
                if ev.job.finished:
                    break
        assert events and events[-1].finished
        assert all(e.data is None and e.chunks == () for e in events)
        assert c.job(view.id).data == payload  # whoever asks gets it
        c.close()


@pytest.mark.process
def test_a_stream_over_the_result_limit_fails_the_job_and_the_worker_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, max_result_bytes=256 * 1024)
    with in_process(backends(), config=config) as (sup, _server, _root):
        c = Client(sup.paths.control_socket)
        view = c.submit_wait("hostile", json.dumps({"stream": 20 << 20, "chunk": 16384}),
                             stream=True, wait_timeout=60)
        assert view.state is JobState.FAILED
        assert "over the engine's limit of 0.25 MiB" in (view.error or "")
        assert view.chunks == () and view.data is None  # what came of it is not kept
        big = c.submit_wait("hostile", json.dumps({"data": 1 << 20}), wait_timeout=60)
        assert big.state is JobState.FAILED and "limit" in (big.error or "")
        fine = c.submit_wait("hostile", json.dumps({"stream": 100_000, "chunk": 10_000}),
                             stream=True, wait_timeout=60)
        assert fine.state is JobState.SUCCEEDED and len(b"".join(fine.chunks)) == 100_000
        assert not any("Traceback" in r.getMessage() for r in caplog.records)
        c.close()


@pytest.mark.process
def test_a_reply_too_large_for_the_socket_is_an_error_not_a_buffer() -> None:
    limits = ControlLimits(max_reply=1 << 20, **FAST)
    with in_process(backends(), limits=limits) as (sup, server, _root):
        c = Client(sup.paths.control_socket)
        job = c.submit("echo", b"e" * (2 << 20))
        with pytest.raises(VramtuiError, match="over the control socket's limit"):
            c.wait(job, 30)
        assert sup.wait(job, 30).state is JobState.SUCCEEDED  # the job itself is fine
        assert stats_of(server)["replies_too_large"] == 1
        assert c.ping() < 5
        c.close()


@pytest.mark.process
def test_limits_are_logged_once_in_a_while_not_per_attack(
        caplog: pytest.LogCaptureFixture) -> None:
    limits = ControlLimits(max_connections=2, **FAST)
    with in_process(backends(), limits=limits) as (sup, _server, _root), \
            caplog.at_level(logging.WARNING, logger="supervisor.control"):
        held = []
        for _ in range(2):
            raw = RawConn(sup.paths.control_socket)
            raw.hello()
            raw.send(header(1000) + b"\x85")
            held.append(raw)
        for _ in range(30):
            late = RawConn(sup.paths.control_socket)
            late.hello()
            late.close()
        lines = [r for r in caplog.records if "all of them busy" in r.getMessage()]
        assert 1 <= len(lines) <= 3
        for raw in held:
            raw.close()


@pytest.mark.process
def test_finished_results_held_in_memory_have_a_budget_and_stay_in_the_journal() -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, max_recent_result_bytes=1 << 20)
    with in_process(backends(), config=config) as (sup, _server, _root):
        payloads = [bytes([65 + i]) * (400 * 1024) for i in range(6)]
        ids = [sup.wait(sup.submit("echo", p), 30).id for p in payloads]
        recent = sup.snapshot().recent
        assert 1 <= len(recent) <= 3  # not all six: 2.4 MiB is over the 1 MiB budget
        assert sum(len(j.data or b"") for j in recent) <= (1 << 20) + 400 * 1024
        for job_id, payload in zip(ids, payloads, strict=True):
            assert sup.job(job_id).data == payload  # the older ones come from the journal
