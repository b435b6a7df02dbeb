"""The sans-I/O codec against hostile and awkward input: sizes, type codes, truncation, bad
timestamps, wrong payload kinds, garbage msgpack, non-map bodies; plus the basic layout."""

from __future__ import annotations

import struct
import time
import tracemalloc
from typing import Any

import msgpack
import pytest

from worker_sdk.protocol import (
    DEFAULT_MAX_FRAME,
    EXTENSIONS,
    HEADER,
    HEADER_SIZE,
    DataType,
    Decoder,
    FrameTooLarge,
    Message,
    MessageType,
    Packed,
    ProtocolError,
    encode,
    encode_bytes,
    features_from_ack,
    features_from_registration,
    registration_payload,
)

KEYS = (b"\xa2id", b"\xacmessage_type", b"\xa9data_type", b"\xa9timestamp", b"\xa7payload")


def body_with(
    timestamp: bytes, payload: Any = b"x", msg_id: int = 5, msg_type: int = 7, dtype: int = 0
) -> bytes:
    """A frame body with a hand-written timestamp value (raw msgpack bytes)."""
    values = [
        msgpack.packb(msg_id),
        msgpack.packb(msg_type),
        msgpack.packb(dtype),
        timestamp,
        msgpack.packb(payload, use_bin_type=True),
    ]
    return b"\x85" + b"".join(k + v for k, v in zip(KEYS, values, strict=True))


def framed(body: bytes, msg_type: int = 7, dtype: int = 0) -> bytes:
    return HEADER.pack(len(body), msg_type, dtype, 0) + body


def raw_frame(msg_type: int, dtype: int, msg_id: int, payload: Any) -> bytes:
    body = msgpack.packb(
        {"id": msg_id, "message_type": msg_type, "data_type": dtype, "timestamp": None,
         "payload": payload},
        use_bin_type=True,
    )
    return framed(body, msg_type, dtype)


def decode_all(data: bytes, decoder: Decoder | None = None) -> list[Message]:
    dec = decoder or Decoder()
    dec.feed(data)
    return list(dec)


# -- layout ------------------------------------------------------------------------------------


def test_header_layout_and_body_keys() -> None:
    frame = encode_bytes(MessageType.DATA, DataType.ENVELOPE, 258, b"abc")
    length, msg_type, dtype, reserved = struct.unpack(">QBBH", frame[:HEADER_SIZE])
    assert (length, msg_type, dtype, reserved) == (len(frame) - 12, 7, 3, 0)
    body = msgpack.unpackb(frame[12:], raw=False, timestamp=0)
    assert list(body) == ["id", "message_type", "data_type", "timestamp", "payload"]
    assert (body["id"], body["message_type"], body["data_type"], body["payload"]) == (
        258, 7, 3, b"abc")


def test_round_trip_and_timestamp() -> None:
    now = time.time()
    [msg] = decode_all(encode_bytes(MessageType.EVENT, DataType.DEFAULT, 1, {"event": 5}))
    assert (msg.type, msg.data_type, msg.id, msg.payload) == (4, 0, 1, {"event": 5})
    assert msg.timestamp is not None and abs(msg.timestamp - now) < 5
    pinned = b"".join(
        encode(MessageType.PING, 0, 2, {"event": 0}, now_ns=1_700_000_000_500_000_000)
    )
    assert struct.pack(">qi", 1_700_000_000, 500_000_000) in pinned
    [msg] = decode_all(pinned)
    assert msg.timestamp == pytest.approx(1_700_000_000.5)


def test_large_payload_is_not_copied() -> None:
    big = bytes(range(256)) * 100  # 25.6 KB
    parts = encode(MessageType.DATA, DataType.DEFAULT, 3, big)
    assert any(p is big for p in parts)
    [msg] = decode_all(b"".join(parts))
    assert msg.payload == big
    envelope = Packed({"payload": big, "headers": {}, "status_code": 200})
    parts = encode(MessageType.DATA, DataType.ENVELOPE, 4, envelope)
    assert any(p is big for p in parts)
    [msg] = decode_all(b"".join(parts))
    assert msgpack.unpackb(msg.payload) == {"payload": big, "headers": {}, "status_code": 200}


def test_feature_negotiation_helpers() -> None:
    reg = registration_payload("w", frozenset({"stream", "cancel"}))
    assert reg["metadata"]["language"] == "python"
    assert features_from_registration(reg) == {"stream", "cancel"}
    assert features_from_registration(registration_payload("w", frozenset())) == frozenset()
    assert features_from_registration({"metadata": "nope"}) == frozenset()
    assert features_from_ack({"vramtui-features": "stream, bogus,,error-status"}) == {
        "stream", "error-status"}
    assert features_from_ack({"vramtui-features": ["cancel", 3]}) == {"cancel"}
    assert features_from_ack("not a map") == frozenset()
    assert features_from_ack({"vramtui-features": ",".join(EXTENSIONS)}) == EXTENSIONS


# -- frame size --------------------------------------------------------------------------------


def test_max_frame_size_is_fatal_and_poisons() -> None:
    limit = 1024
    ok = encode_bytes(MessageType.DATA, 0, 1, b"a" * (limit - 100))
    body_len = len(ok) - HEADER_SIZE
    dec = Decoder(max_frame_size=body_len)
    [msg] = decode_all(ok, dec)  # exactly at the limit: fine
    assert msg.id == 1
    dec.feed(encode_bytes(MessageType.DATA, 0, 2, b"a" * (limit - 99)))
    with pytest.raises(FrameTooLarge) as info:
        dec.next()
    assert info.value.fatal and info.value.length == body_len + 1
    assert info.value.limit == body_len
    dec.feed(ok)  # a good frame after it cannot be reached: the stream is out of sync
    for _ in range(2):
        with pytest.raises(FrameTooLarge):
            dec.next()


def test_huge_length_header_allocates_nothing() -> None:
    dec = Decoder()
    tracemalloc.start()
    try:
        dec.feed(HEADER.pack(2**63, MessageType.DATA, 0, 0) + b"tiny")
        with pytest.raises(FrameTooLarge) as info:
            dec.next()
        dec.feed(b"more bytes")
        view = dec.get_buffer(16)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.length == 2**63 and info.value.limit == DEFAULT_MAX_FRAME
    assert len(view) < 1024 * 1024
    assert peak < 1024 * 1024


# -- type codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(("msg_type", "dtype"), [(9, 0), (255, 0), (7, 4), (7, 200)])
def test_unknown_type_codes_are_fatal(msg_type: int, dtype: int) -> None:
    dec = Decoder()
    good = encode_bytes(MessageType.PING, 0, 1, {"event": 0})
    dec.feed(good + framed(body_with(b"\xc0"), msg_type, dtype) + good)
    assert dec.next() is not None
    with pytest.raises(ProtocolError) as info:
        dec.next()
    assert info.value.fatal and not isinstance(info.value, FrameTooLarge)
    assert "unknown type code" in str(info.value)
    with pytest.raises(ProtocolError):
        dec.next()  # poisoned


def test_unknown_type_code_fatal_before_body_arrives() -> None:
    dec = Decoder()
    dec.feed(HEADER.pack(10_000, 42, 0, 0))
    with pytest.raises(ProtocolError) as info:
        dec.next()
    assert info.value.fatal


# -- truncation --------------------------------------------------------------------------------


def test_truncated_frames_wait_for_more() -> None:
    frame = encode_bytes(MessageType.DATA, 0, 9, b"payload" * 50)
    dec = Decoder()
    for byte in frame[:-1]:
        dec.feed(bytes([byte]))
        assert dec.next() is None
    assert dec.buffered == len(frame) - 1
    dec.feed(frame[-1:])
    msg = dec.next()
    assert msg is not None and msg.payload == b"payload" * 50
    assert dec.next() is None and dec.buffered == 0


def test_truncated_then_zero_copy_receive() -> None:
    frame = encode_bytes(MessageType.DATA, 0, 9, b"z" * 200_000)
    dec = Decoder()
    pos = 0
    while pos < len(frame):
        assert dec.next() is None
        view = dec.get_buffer(1000)
        n = min(len(view), len(frame) - pos, 7777)
        view[:n] = frame[pos : pos + n]
        view.release()
        dec.buffer_updated(n)
        pos += n
    msg = dec.next()
    assert msg is not None and msg.payload == b"z" * 200_000


# -- timestamps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ext", "expected"),
    [
        (b"\xc7\x0c\xff" + struct.pack(">qi", 10, 2_000_000_000), 12.0),  # nanos > 1e9
        (b"\xc7\x0c\xff" + struct.pack(">qi", -5, 0), -5.0),  # negative seconds
        (b"\xc7\x0c\xff" + struct.pack(">qi", -1, -1), -1.000000001),
        (b"\xc7\x0c\xff" + struct.pack(">qi", 1_700_000_000, 500_000_000), 1_700_000_000.5),
        (b"\xd6\xff" + struct.pack(">I", 1234), 1234.0),  # timestamp32
        (b"\xd7\xff" + struct.pack(">Q", (0x3FFFFFFF << 34) | 7), None),  # nsec30 > 1e9
        (b"\xc7\x05\xff" + b"\x00" * 5, None),  # a time ext of a length msgpack refuses
        (b"\xd4\xff\x00", None),
        (b"\xc0", None),  # nil
        (b"\xa3now", None),  # a string
        (b"\xc7\x0c\x01" + b"\x00" * 12, None),  # some other ext type
    ],
)
def test_bad_timestamps_still_decode(ext: bytes, expected: float | None) -> None:
    dec = Decoder()
    dec.feed(framed(body_with(ext, payload=b"kept")) + encode_bytes(7, 0, 6, b"next"))
    msg = dec.next()
    assert msg is not None and (msg.id, msg.payload) == (5, b"kept")
    if expected is None:
        assert msg.timestamp is None or isinstance(msg.timestamp, float)
    else:
        assert msg.timestamp == pytest.approx(expected)
    nxt = dec.next()
    assert nxt is not None and nxt.payload == b"next"


def test_missing_timestamp_and_id() -> None:
    body = msgpack.packb({"message_type": 5, "data_type": 0, "payload": {"event": 0}})
    [msg] = decode_all(framed(body, 5, 0))
    assert (msg.id, msg.timestamp) == (0, None)


# -- non-fatal body errors -----------------------------------------------------------------


def test_str_where_bin_is_due_keeps_stream_in_sync() -> None:
    dec = Decoder()
    dec.feed(raw_frame(7, 0, 41, "a str, not bin") + encode_bytes(7, 0, 42, b"after"))
    with pytest.raises(ProtocolError) as info:
        dec.next()
    assert not info.value.fatal and info.value.message_id == 41
    assert "must be bin, got str" in str(info.value)
    msg = dec.next()
    assert msg is not None and (msg.id, msg.payload) == (42, b"after")


@pytest.mark.parametrize(
    ("msg_type", "dtype", "payload", "needle"),
    [
        (7, 3, 12, "envelope payload must be bin or map"),
        (7, 3, {"payload": "str"}, "carry its payload as bin"),
        (7, 2, [1], "stream payload must be bin or nil"),
        (7, 1, None, "must be bin, got nil"),
        (4, 0, [5], "EVENT payload must be a map"),
        (0, 0, "me", "REGISTRATION payload must be a map"),
    ],
)
def test_wrong_payload_kinds_are_non_fatal(
    msg_type: int, dtype: int, payload: Any, needle: str
) -> None:
    dec = Decoder()
    dec.feed(raw_frame(msg_type, dtype, 3, payload) + encode_bytes(5, 0, 4, {"event": 0}))
    with pytest.raises(ProtocolError, match=needle) as info:
        dec.next()
    assert not info.value.fatal and info.value.message_id == 3
    msg = dec.next()
    assert msg is not None and msg.id == 4


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\xc1", "malformed msgpack"),  # the never-used byte
        (b"\x85\xa2id", "malformed msgpack"),  # truncated inside the body
        (msgpack.packb({"id": 1}) + b"\x00", "malformed msgpack"),  # trailing bytes
        (b"\xdd\xff\xff\xff\xff", "malformed msgpack"),  # array of 4G elements, no data
        (b"\x91" * 3000 + b"\xc0", "malformed msgpack"),  # nested too deep
        (b"", "malformed msgpack"),
        (msgpack.packb([1, 2, 3]), "not a map"),
        (msgpack.packb(b"bin"), "not a map"),
        (msgpack.packb(None), "frame body is nil, not a map"),
        (msgpack.packb({"id": "seven", "payload": b""}), "frame id is str"),
        (msgpack.packb({"id": True, "payload": b""}), "frame id is bool"),
    ],
)
def test_garbage_bodies_are_non_fatal(body: bytes, needle: str) -> None:
    dec = Decoder()
    dec.feed(framed(body) + encode_bytes(7, 0, 8, b"next"))
    with pytest.raises(ProtocolError, match=needle) as info:
        dec.next()
    assert not info.value.fatal and info.value.message_id is None
    msg = dec.next()
    assert msg is not None and msg.payload == b"next"
