"""The conversation layer against a hostile peer, both ends, sans I/O.

Every frame here is written by hand with msgpack (never by the code under test), so a frame
can be anything a hostile worker or server could send: wrong types, huge numbers, NaN, junk
registrations, replies to requests never made.  Each check says what must be refused, and
that the conversation stays usable (or is given up, when the stream is).
"""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import msgpack
import pytest

from worker_sdk.conversation import (
    MAX_ERROR_TEXT,
    MAX_PROGRESS_TEXT,
    MAX_REFUSED_IN_A_ROW,
    Channel,
    LocalProtocolError,
    ServerConversation,
    WorkerConversation,
)
from worker_sdk.events import (
    Acknowledgement,
    Cancel,
    Chunk,
    EndOfStream,
    EnvelopeReply,
    ErrorReply,
    Notice,
    Ping,
    Pong,
    Progress,
    Registration,
    Reply,
    Request,
    Shutdown,
    Status,
    StatusReply,
    StatusRequest,
)
from worker_sdk.protocol import EXTENSIONS, HEADER, FrameTooLarge, ProtocolError, encode_bytes

CONTROL, DATA = Channel.CONTROL, Channel.DATA
STATUS_EVENT, NOTIFY = 5, 1


def frame(msg_type: int, dtype: int, msg_id: int, payload: Any) -> bytes:
    """A frame as any peer could write it (msgpack's own layout, not ours)."""
    body = msgpack.packb({"id": msg_id, "message_type": msg_type, "data_type": dtype,
                          "timestamp": None, "payload": payload}, use_bin_type=True)
    return HEADER.pack(len(body), msg_type, dtype, 0) + body


def registration(name: Any = "w", features: Any = None, **metadata: Any) -> bytes:
    meta: dict[str, Any] = {"language": "python", "version": "1.0", **metadata}
    if features is not None:
        meta["vramtui-features"] = features
    return frame(0, 0, 1, {"identifier": name, "type": "ml_worker", "metadata": meta})


def server(channel: Channel = DATA, features: str | None = ",".join(sorted(EXTENSIONS)),
           ) -> ServerConversation:
    conv = ServerConversation(channel)
    conv.receive_data(registration(features=features))
    reg = conv.next_event()
    assert isinstance(reg, Registration) and conv.registered
    return conv


def refused(conv: ServerConversation | WorkerConversation, data: bytes) -> ProtocolError:
    conv.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        conv.next_event()
    return info.value


def event(conv: ServerConversation | WorkerConversation, data: bytes) -> Any:
    conv.receive_data(data)
    got = conv.next_event()
    assert got is not None
    return got


def open_request(conv: ServerConversation, wire_id: int = 7, stream: bool = False) -> int:
    conv.send(Request(wire_id, b"in", "job-1", stream=stream))
    return wire_id


def envelope_reply(wire_id: int, **fields: Any) -> bytes:
    inner = {"payload": b"out", "headers": {}, "status_code": 200, **fields}
    return frame(7, 3, wire_id, msgpack.packb(inner, use_bin_type=True))


# -- the handshake -----------------------------------------------------------------------------


def test_nothing_before_a_registration() -> None:
    conv = ServerConversation(DATA)
    exc = refused(conv, frame(7, 0, 1, b"data first"))
    assert exc.fatal and "first frame must be a REGISTRATION" in str(exc)
    with pytest.raises(LocalProtocolError):
        conv.send(Ping(1))  # and nothing is sent to an unregistered peer


@pytest.mark.parametrize(
    ("frame_bytes", "needle"),
    [
        (registration(name=7), "identifier"),
        (registration(name=""), "identifier"),
        (registration(name="x" * 10_000), "identifier"),
        (registration(name="evil\nname"), "identifier"),
        (registration(name=None), "identifier"),
        (registration(features=5), "features"),
        (registration(features=[1, 2]), "features"),
        (registration(features="a," * 5000), "features"),
        (registration(**{"vramtui-protocol": 5}), "version"),
        (frame(0, 0, 1, {"identifier": "w", "metadata": ["not", "a", "map"]}), "metadata"),
        (frame(0, 0, 1, {"identifier": "w", "type": 12}), "type"),
        (frame(0, 0, 1, ["not a map"]), "must be a map"),
    ],
)
def test_a_registration_with_junk_is_refused_for_good(frame_bytes: bytes, needle: str) -> None:
    conv = ServerConversation(CONTROL)
    exc = refused(conv, frame_bytes)
    assert needle in str(exc)
    assert exc.fatal or not conv.registered
    assert not conv.registered


def test_a_plain_verda_registration_negotiates_nothing_and_ours_what_both_offer() -> None:
    plain = ServerConversation(CONTROL)
    reg = event(plain, registration())
    assert (reg.name, reg.features, reg.version) == ("w", frozenset(), None)
    assert plain.features == frozenset()
    ours = ServerConversation(CONTROL, offered=frozenset({"cancel", "stream"}))
    reg = event(ours, registration(features="cancel,progress,bogus",
                                   **{"vramtui-protocol": "1"}))
    assert reg.features == {"cancel", "progress"} and reg.version == "1"
    assert ours.features == {"cancel"}
    ack = msgpack.unpackb(b"".join(ours.acknowledge())[12:], raw=False, timestamp=2)
    assert ack["id"] == 1 and ack["payload"]["identifier"] == "w"
    assert ack["payload"]["vramtui-features"] == "cancel,stream"


def test_a_second_registration_is_refused() -> None:
    conv = server()
    exc = refused(conv, registration(name="someone-else"))
    assert not exc.fatal and conv.name == "w"


# -- replies on the data socket ----------------------------------------------------------


def test_a_reply_to_no_request_is_refused_and_names_none() -> None:
    conv = server()
    exc = refused(conv, frame(7, 0, 99, b"unasked"))
    assert not exc.fatal and exc.message_id is None
    open_request(conv, 5)
    assert event(conv, frame(7, 0, 5, b"ok")) == Reply(5, b"ok")
    exc = refused(conv, frame(7, 0, 5, b"a second reply"))  # the request is closed
    assert exc.message_id is None


def test_an_envelope_whose_payload_is_an_int_allocates_nothing() -> None:
    conv = server()
    wire_id = open_request(conv)
    tracemalloc.start()
    try:
        exc = refused(conv, envelope_reply(wire_id, payload=2**40))
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    assert exc.message_id == wire_id and not exc.fatal
    assert "payload must be bin" in str(exc)
    assert conv.open_requests == 0  # the request failed; its late replies are refused
    assert refused(conv, envelope_reply(wire_id)).message_id is None


@pytest.mark.parametrize("payload", [2**40, -1, None, "str", [b"x"], {"payload": b"x"}])
def test_an_envelope_frame_that_is_not_bin_is_refused(payload: Any) -> None:
    conv = server()
    wire_id = open_request(conv)
    exc = refused(conv, frame(7, 3, wire_id, payload))
    assert exc.message_id == wire_id and not exc.fatal
    assert conv.open_requests == 0


@pytest.mark.parametrize("code", [2**64 - 1, 2**63, -1, 0, 99, 600, True, "200", 200.0, None])
def test_status_codes_out_of_range_or_of_the_wrong_type(code: Any) -> None:
    conv = server()
    wire_id = open_request(conv)
    exc = refused(conv, envelope_reply(wire_id, status_code=code))
    assert exc.message_id == wire_id and "status_code" in str(exc)
    wire_id = open_request(conv, 8)
    exc = refused(conv, frame(8, 0, wire_id, {"error": "x", "type": "prediction_error",
                                              "status_code": code}))
    assert exc.message_id == wire_id


@pytest.mark.parametrize("code", [100, 200, 404, 599])
def test_status_codes_in_range_pass(code: int) -> None:
    conv = server()
    got = event(conv, envelope_reply(open_request(conv), status_code=code))
    assert got == EnvelopeReply(7, b"out", {}, code)


@pytest.mark.parametrize(
    "headers",
    [[("a", "b")], "a: b", 5, {"a": [1]}, {"a": {"b": 1}}, {1: "x"}, {"": "x"},
     {"a": b"bytes"}, {"a": None}, {"a": float("nan")}, {"a": float("inf")}, {"a": 2**64 - 1},
     {f"h{i}": "v" for i in range(1000)}, {"a": "v" * 100_000}],
)
def test_headers_that_are_not_a_map_of_scalars_are_refused(headers: Any) -> None:
    conv = server()
    wire_id = open_request(conv)
    exc = refused(conv, envelope_reply(wire_id, headers=headers))
    assert exc.message_id == wire_id and "header" in str(exc)


def test_headers_of_scalars_pass() -> None:
    conv = server()
    headers = {"Content-Type": "image/png", "X-Count": 3, "X-Score": 0.5, "X-Ok": True}
    got = event(conv, envelope_reply(open_request(conv), headers=headers))
    assert got.headers == headers


def test_error_replies() -> None:
    conv = server()
    wire_id = open_request(conv)
    got = event(conv, frame(8, 0, wire_id, {"error": "E" * 100_000, "type": "cancelled",
                                            "status_code": 499}))
    assert isinstance(got, ErrorReply) and got.status_code == 499 and got.kind == "cancelled"
    assert len(got.error) == MAX_ERROR_TEXT  # cut, not refused: an error must get through
    plain = server(features=None)  # without error-status, a status code is not believed
    wire_id = open_request(plain)
    got = event(plain, frame(8, 0, wire_id, {"error": "x", "type": "prediction_error",
                                             "status_code": 200}))
    assert got.status_code == 500
    for bad in ([1], "text", {"error": 5}, {"error": "x", "type": 7}):
        wire_id = open_request(conv, 20)
        assert refused(conv, frame(8, 0, wire_id, bad)).message_id == 20


def test_streams_explicit_and_plain() -> None:
    conv = server()
    wire_id = open_request(conv, 3, stream=True)
    assert event(conv, frame(7, 2, 3, b"a")) == Chunk(3, b"a")
    assert event(conv, frame(7, 2, 3, None)) == EndOfStream(3)
    assert refused(conv, frame(7, 2, 3, b"after the end")).message_id is None
    plain = server(features=None)
    open_request(plain, 4, stream=True)
    assert event(plain, frame(7, 0, 4, b"a")) == Chunk(4, b"a")
    assert event(plain, frame(7, 0, 4, b"")) == EndOfStream(4)
    open_request(plain, 5)  # not a stream: the first DATA is the whole reply
    assert event(plain, frame(7, 0, 5, b"")) == Reply(5, b"")
    open_request(plain, 6, stream=True)  # STREAM frames were never negotiated here
    assert refused(plain, frame(7, 2, 6, b"x")).message_id == 6
    assert wire_id == 3


# -- control events from a worker ------------------------------------------------------------


@pytest.mark.parametrize("fraction", [math.nan, math.inf, -math.inf, 1e308, -0.5, 1.0000001,
                                      True, "0.5", [0.5]])
def test_progress_fractions_outside_zero_to_one_are_refused(fraction: Any) -> None:
    conv = server(CONTROL)
    exc = refused(conv, frame(4, 0, 9, {"event": NOTIFY, "request": 7, "fraction": fraction,
                                        "message": "x"}))
    assert not exc.fatal and "fraction" in str(exc)


def test_progress_that_passes() -> None:
    conv = server(CONTROL)
    for fraction in (0, 0.5, 1, None):
        got = event(conv, frame(4, 0, 9, {"event": NOTIFY, "request": 7, "fraction": fraction,
                                          "message": "m" * 5000}))
        assert isinstance(got, Progress) and got.request == 7
        assert got.fraction == (None if fraction is None else float(fraction))
        assert len(got.message) == MAX_PROGRESS_TEXT
    for request in (-1, -(2**63), "7", None, 1.5):
        refused(conv, frame(4, 0, 9, {"event": NOTIFY, "request": request, "fraction": 0.5}))
    plain = server(CONTROL, features=None)  # no progress extension: not believed
    refused(plain, frame(4, 0, 9, {"event": NOTIFY, "request": 7, "fraction": 0.5}))


@pytest.mark.parametrize("code", [6, 99, 255, -1, 2**64 - 1, "5", None, 5.0])
def test_unknown_event_codes_are_refused(code: Any) -> None:
    exc = refused(server(CONTROL), frame(4, 0, 9, {"event": code, "status": "ready"}))
    assert not exc.fatal and "event code" in str(exc)


@pytest.mark.parametrize("code", [0, 2, 3, 4])  # EMPTY, CANCEL, SHUTDOWN, RESTART
def test_events_a_worker_has_no_business_sending(code: int) -> None:
    assert "not expected" in str(refused(server(CONTROL), frame(4, 0, 9, {"event": code})))


def test_statuses() -> None:
    conv = server(CONTROL)
    assert event(conv, frame(4, 0, 2, {"event": STATUS_EVENT, "status": "busy"})) == \
        Status(2, "busy")
    for status in ("hacked", "", None, 5, "ready" * 100):
        refused(conv, frame(4, 0, 3, {"event": STATUS_EVENT, "status": status}))
    got = event(conv, frame(4, 0, 4, {"event": STATUS_EVENT, "status": "failed",
                                      "error": "x" * 100_000}))
    assert got.status == "failed" and len(got.error) == MAX_ERROR_TEXT
    plain = server(CONTROL, features=None)  # a plain worker never says "failed"
    refused(plain, frame(4, 0, 4, {"event": STATUS_EVENT, "status": "failed", "error": "x"}))


def test_pings_pongs_and_responses_must_answer_something() -> None:
    conv = server(CONTROL)
    assert "PING is not expected" in str(refused(conv, frame(5, 0, 1, {"event": 0})))
    assert "answers no ping" in str(refused(conv, frame(6, 0, 1, {"event": 0})))
    for ping_id in (10, 11, 12):
        conv.send(Ping(ping_id))
    assert event(conv, frame(6, 0, 11, {"event": 0})) == Pong(11)  # answers 10 too
    assert conv.unanswered_pings == 1
    refused(conv, frame(6, 0, 10, {"event": 0}))
    assert "answers no request" in str(refused(conv, frame(3, 0, 40, {"status": "ready"})))
    conv.send(StatusRequest(40))
    refused(conv, frame(3, 0, 40, {"status": 5}))  # refused, and no longer awaited
    conv.send(StatusRequest(41))
    assert event(conv, frame(3, 0, 41, {"status": "ready"})) == StatusReply(41, "ready")


def test_data_frames_on_the_control_socket_and_events_on_the_data_socket() -> None:
    assert "not expected" in str(refused(server(CONTROL), frame(7, 0, 1, b"x")))
    assert "not expected" in str(refused(server(DATA), frame(4, 0, 1, {"event": 5,
                                                                      "status": "ready"})))


def test_progress_on_the_data_socket_only_with_data_progress() -> None:
    notify = frame(4, 0, 3, {"event": NOTIFY, "request": 1, "fraction": 0.5, "message": "half"})
    got = event(server(DATA), notify)  # data-progress: in order with the chunks
    assert isinstance(got, Progress) and (got.request, got.fraction) == (1, 0.5)
    without = ",".join(sorted(EXTENSIONS - {"data-progress"}))
    assert "not expected" in str(refused(server(DATA, without), notify))


def test_a_flood_of_refused_frames_gives_the_connection_up() -> None:
    conv = server(CONTROL)
    junk = frame(4, 0, 9, {"event": 99})
    for _ in range(MAX_REFUSED_IN_A_ROW):
        assert not refused(conv, junk).fatal
    event(conv, frame(4, 0, 2, {"event": STATUS_EVENT, "status": "ready"}))  # resets the count
    for _ in range(MAX_REFUSED_IN_A_ROW):
        assert not refused(conv, junk).fatal
    exc = refused(conv, junk)
    assert exc.fatal and "giving up" in str(exc)


def test_frames_at_the_size_limit() -> None:
    limit = 4096
    conv = ServerConversation(DATA, max_frame_size=limit)
    conv.receive_data(registration())
    conv.next_event()
    open_request(conv, 1)
    open_request(conv, 2)
    base = len(frame(7, 0, 1, b"x" * 300)) - 12 - 300  # the body around a bin16 payload
    at = frame(7, 0, 1, b"x" * (limit - base))
    over = frame(7, 0, 2, b"x" * (limit - base + 1))
    assert (len(at) - 12, len(over) - 12) == (limit, limit + 1)
    assert event(conv, at).id == 1
    conv.receive_data(over[:12])  # refused on the header alone, before the body arrives
    with pytest.raises(FrameTooLarge) as info:
        conv.next_event()
    assert info.value.fatal and info.value.length == limit + 1


# -- the worker's end, against a hostile server ---------------------------------------------


def worker(channel: Channel, features: frozenset[str] = EXTENSIONS) -> WorkerConversation:
    conv = WorkerConversation(channel)
    conv.adopt(features)
    return conv


@pytest.mark.parametrize("request_id", ["x", -1, -(2**63), None, 1.5])
def test_a_cancel_of_junk_is_refused(request_id: Any) -> None:
    exc = refused(worker(CONTROL), frame(4, 0, 3, {"event": 2, "request": request_id}))
    assert not exc.fatal and "cancel" in str(exc)


def test_server_events_map_to_typed_messages() -> None:
    conv = worker(CONTROL)
    assert event(conv, frame(4, 0, 1, {"event": 2, "request": 7})) == Cancel(1, 7)
    assert event(conv, frame(4, 0, 2, {"Event": 3})) == Shutdown(2)  # Go's spelling
    assert event(conv, frame(4, 0, 3, {"event": 4})) == Notice(3, 4)
    assert isinstance(event(conv, frame(2, 0, 4, "junk request")), StatusRequest)
    assert "event code" in str(refused(conv, frame(4, 0, 5, {"event": 42})))
    plain = worker(CONTROL, frozenset())  # CANCEL without the extension: only logged
    assert event(plain, frame(4, 0, 1, {"event": 2, "request": "junk"})) == Notice(1, 2)
    ack = event(WorkerConversation(CONTROL), frame(1, 0, 1, {"identifier": 5}))
    assert isinstance(ack, Acknowledgement) and ack.identifier == "5"


@pytest.mark.parametrize(
    ("envelope", "needle"),
    [
        ({"payload": b"x", "deadline": math.nan}, "deadline"),
        ({"payload": b"x", "deadline": math.inf}, "deadline"),
        ({"payload": b"x", "deadline": "soon"}, "deadline"),
        ({"payload": b"x", "metadata": {1: "int key"}}, "metadata"),
        ({"payload": b"x", "metadata": [1]}, "metadata"),
        ({"payload": b"x", "request_id": "r" * 1000}, "request_id"),
        ({"payload": b"x", "request_id": [1]}, "request_id"),
        ({"payload": 5}, "bin"),
    ],
)
def test_a_request_envelope_with_junk_gets_an_error_for_that_request(
        envelope: dict[str, Any], needle: str) -> None:
    exc = refused(worker(DATA), frame(7, 3, 12, envelope))
    assert not exc.fatal and exc.message_id == 12 and needle in str(exc)


def test_requests_read_fast_and_read_in_full_agree() -> None:
    """Envelopes in our layout take the fast path; the same request in msgpack's own
    (reordered) layout takes the general one: they must read the same."""
    for wire_id in (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63):
        for request_id in ("j", "j-" + "x" * 40, "ünïcode"):
            for payload in (b"", b"p", bytes(300), bytes(70_000)):
                env = {"request_id": request_id, "metadata": {}, "deadline": None,
                       "payload": payload}
                fast = event(worker(DATA), encode_bytes(7, 3, wire_id, env))
                full = event(worker(DATA), frame(7, 3, wire_id, dict(reversed(env.items()))))
                assert (fast.id, fast.payload, fast.request_id) == \
                    (full.id, full.payload, full.request_id) == (wire_id, payload, request_id)
                assert not fast.metadata and not full.metadata
            plain = event(worker(DATA), encode_bytes(7, 0, wire_id, b"plain"))
            assert plain == Request(wire_id, b"plain")
    with_meta = event(worker(DATA), encode_bytes(7, 3, 1, {
        "request_id": "r", "metadata": {"user": "ann"}, "deadline": 12.5, "payload": b"x"}))
    assert (with_meta.metadata, with_meta.deadline) == ({"user": "ann"}, 12.5)


def test_a_streamed_request_is_refused_with_its_id() -> None:
    exc = refused(worker(DATA), frame(7, 2, 4, b"x"))
    assert exc.message_id == 4 and not exc.fatal


# -- what our own side may send -------------------------------------------------------------


def test_local_rules() -> None:
    plain = worker(DATA, frozenset())
    assert plain.send(Chunk(1, b"")) == []  # an empty chunk would end a plain stream
    assert b"".join(plain.send(EndOfStream(1))).endswith(b"\xa7payload\xc4\x00")
    with pytest.raises(LocalProtocolError, match="status_code"):
        worker(DATA).send(EnvelopeReply(1, b"x", {}, 2**64 - 1))
    with pytest.raises(LocalProtocolError, match="header"):
        worker(DATA).send(EnvelopeReply(1, b"x", {"a": [1]}, 200))
    with pytest.raises(LocalProtocolError, match="init-failure"):
        worker(CONTROL, frozenset()).send(Status(1, "failed", "boom"))
    with pytest.raises(LocalProtocolError, match="progress"):
        worker(CONTROL, frozenset()).send(Progress(1, 2, 0.5, ""))
    with pytest.raises(LocalProtocolError, match="cancel"):
        server(CONTROL, features=None).send(Cancel(1, 2))
    with pytest.raises(LocalProtocolError):
        server(CONTROL).send(Request(1, b"x"))  # requests go on the data socket
    conv = server(CONTROL)
    for i in range(256):
        conv.send(Ping(i))
    with pytest.raises(LocalProtocolError, match="unanswered"):
        conv.send(Ping(999))
    assert ErrorReply(1, "e").status_code == 500
