"""Property tests of the codec (hypothesis).

1. Any byte string, split anywhere, decodes to exactly the results of decoding it in one piece
   (messages and errors, up to and including the first fatal error), through ``feed`` and
   through ``get_buffer``/``buffer_updated``, and never raises anything but ProtocolError.
2. encode -> decode round-trips random messages (ids, payloads of random sizes including the
   >= 16 KiB zero-copy path, map payloads, Packed envelopes).
3. Our encoder's bytes equal verda-io 0.4.4's ``pack_message_with_time`` + ``create_header``
   output, except the 12 timestamp bytes.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verda_io.transport import SocketTransport, pack_message_with_time

from worker_sdk.protocol import (
    HEADER,
    DataType,
    Decoder,
    FrameTooLarge,
    Message,
    MessageType,
    Packed,
    ProtocolError,
    encode,
    encode_bytes,
)

pytestmark = pytest.mark.timeout(120)
PROPS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
MAX_FRAME = 64 * 1024  # small, so random length headers cannot make the decoder allocate much
ZERO_COPY = 16 * 1024
TS_MARK = b"\xa9timestamp\xc7\x0c\xff"

# -- strategies --------------------------------------------------------------------------------

ids = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@st.composite
def blobs(draw: st.DrawFn) -> bytes:
    """Bytes of a random size: mostly small, sometimes around and above the zero-copy size."""
    size = draw(
        st.one_of(
            st.integers(0, 300),
            st.integers(ZERO_COPY - 64, ZERO_COPY + 64),
            st.integers(ZERO_COPY, 200_000),
        )
    )
    seed = draw(st.binary(min_size=1, max_size=16))
    return (seed * (size // len(seed) + 1))[:size]


def buffer_like(data: bytes) -> st.SearchStrategy[Any]:
    return st.sampled_from([data, bytearray(data), memoryview(data)])


@st.composite
def messages(draw: st.DrawFn) -> tuple[int, int, int, Any, Any]:
    """(type, data type, id, payload to encode, payload expected after decoding)."""
    msg_id = draw(ids)
    kind = draw(st.sampled_from(["data", "stream", "envelope", "packed", "event", "other"]))
    if kind == "data":
        blob = draw(blobs())
        return MessageType.DATA, DataType.DEFAULT, msg_id, draw(buffer_like(blob)), blob
    if kind == "stream":
        blob = draw(st.none() | blobs())
        return MessageType.DATA, DataType.STREAM, msg_id, blob, blob
    if kind == "envelope":
        env = {
            "request_id": draw(st.text(max_size=10)),
            "metadata": draw(st.dictionaries(st.text(max_size=5), values, max_size=3)),
            "deadline": draw(st.none() | st.floats(allow_nan=False)),
            "payload": draw(blobs()),
        }
        return MessageType.DATA, DataType.ENVELOPE, msg_id, env, env
    if kind == "packed":
        inner = {"payload": draw(blobs()), "headers": draw(st.dictionaries(
            st.text(max_size=5), st.text(max_size=5), max_size=3)),
            "status_code": draw(st.integers(100, 599))}
        return MessageType.DATA, DataType.ENVELOPE, msg_id, Packed(inner), inner
    if kind == "event":
        payload = draw(st.dictionaries(st.text(max_size=8), values, max_size=4))
        payload["blob"] = draw(blobs())  # a map with a (maybe large) bin inside
        return MessageType.EVENT, DataType.DEFAULT, msg_id, payload, payload
    msg_type = draw(st.sampled_from([MessageType.REQUEST, MessageType.RESPONSE,
                                     MessageType.PING, MessageType.PONG, MessageType.ERROR]))
    payload = draw(values)
    return msg_type, DataType.DEFAULT, msg_id, payload, payload


@st.composite
def hostile_streams(draw: st.DrawFn) -> bytes:
    """Valid frames, frames with random bodies, bad headers and raw junk, concatenated."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 8))):
        choice = draw(st.integers(0, 6))
        if choice == 6:  # a run of small frames: the decoder compacts around partial ones
            for i in range(draw(st.integers(10, 80))):
                parts.append(encode_bytes(MessageType.PING, 0, i, {"event": 0, "n": "x" * i}))
        elif choice == 5:  # medium valid frames: several of them overflow the decoder's buffer
            size = draw(st.integers(1000, 30_000))
            parts.append(encode_bytes(MessageType.DATA, 0, draw(ids), bytes([size % 251]) * size))
        elif choice == 0:
            t, d, i, payload, _ = draw(messages())
            parts.append(encode_bytes(t, d, i, payload))
        elif choice == 1:  # a well-framed random body (mostly garbage msgpack)
            body = draw(st.binary(max_size=80))
            t = draw(st.integers(0, 9))
            d = draw(st.integers(0, 4))
            parts.append(HEADER.pack(len(body), t, d, 0) + body)
        elif choice == 2:  # a well-framed msgpack value of any shape
            body = msgpack.packb(draw(values), use_bin_type=True)
            parts.append(HEADER.pack(len(body), draw(st.integers(0, 8)), 0, 0) + body)
        elif choice == 3:  # a valid frame with some bytes flipped
            t, d, i, payload, _ = draw(messages())
            frame = bytearray(encode_bytes(t, d, i, payload)[:400])
            for _ in range(draw(st.integers(1, 3))):
                frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
            parts.append(bytes(frame))
        else:
            parts.append(draw(st.binary(max_size=60)))
    return b"".join(parts)


# -- property 1: chunking never changes the results ----------------------------------------


Result = tuple[Any, ...]


def drain(decoder: Decoder, out: list[Result]) -> bool:
    """Append every result available now; True once a fatal error was reached."""
    while True:
        try:
            msg = decoder.next()
        except ProtocolError as exc:
            out.append(("error", type(exc).__name__, exc.fatal, exc.message_id, str(exc)))
            if exc.fatal:
                return True
            continue
        if msg is None:
            return False
        out.append(("message", msg.type, msg.data_type, msg.id, repr(msg.payload),
                    msg.timestamp))


def small_decoder() -> Decoder:
    """A decoder whose buffer starts tiny, so that growth and compaction happen often."""
    dec = Decoder(MAX_FRAME)
    dec._buf = bytearray(64)
    return dec


def decode_whole(data: bytes) -> list[Result]:
    out: list[Result] = []
    dec = Decoder(MAX_FRAME)
    dec.feed(data)
    drain(dec, out)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@PROPS
@given(data=hostile_streams(), cuts=st.lists(st.integers(0, 10**6), max_size=30),
       zero_copy=st.booleans(), small=st.booleans())
def test_chunking_never_changes_results(
    data: bytes, cuts: list[int], zero_copy: bool, small: bool
) -> None:
    whole = decode_whole(data)
    out: list[Result] = []
    dec = small_decoder() if small else Decoder(MAX_FRAME)
    for chunk in split(data, cuts):
        if zero_copy:
            view = dec.get_buffer(len(chunk))
            assert len(view) >= len(chunk)
            view[: len(chunk)] = chunk
            view.release()
            dec.buffer_updated(len(chunk))
        else:
            dec.feed(chunk)
        if drain(dec, out):
            break
    assert out == whole


@PROPS
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_random_bytes_only_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    whole = decode_whole(data)
    out: list[Result] = []
    dec = small_decoder()
    for chunk in split(data, cuts):
        dec.feed(chunk)
        if drain(dec, out):
            break
    assert out == whole


@PROPS
@given(length=st.integers(64 * 1024 * 1024 + 1, 2**64 - 1), tail=st.binary(max_size=20))
def test_huge_lengths_are_frame_too_large(length: int, tail: bytes) -> None:
    dec = Decoder(64 * 1024 * 1024)
    dec.feed(HEADER.pack(length, MessageType.DATA, 0, 0) + tail)
    with pytest.raises(FrameTooLarge):
        dec.next()
    assert len(dec.get_buffer(1)) < 1024 * 1024


# -- property 2: round trip ------------------------------------------------------------------


def decode_one(frame: bytes) -> Message:
    dec = Decoder()
    dec.feed(frame)
    msg = dec.next()
    assert msg is not None and dec.next() is None and dec.buffered == 0
    return msg


@PROPS
@given(message=messages())
def test_round_trip(message: tuple[int, int, int, Any, Any]) -> None:
    msg_type, dtype, msg_id, payload, expected = message
    parts = encode(msg_type, dtype, msg_id, payload)
    big = isinstance(payload, bytes | bytearray | memoryview) and len(payload) >= ZERO_COPY
    if big:
        assert any(p is payload for p in parts)  # passed through uncopied
    msg = decode_one(b"".join(parts))
    assert (msg.type, msg.data_type, msg.id) == (msg_type, dtype, msg_id)
    if isinstance(payload, Packed):
        assert isinstance(msg.payload, bytes)
        assert msgpack.unpackb(msg.payload, raw=False) == expected
    else:
        assert msg.payload == expected


@PROPS
@given(batch=st.lists(messages(), min_size=1, max_size=5))
def test_round_trip_many_in_one_stream(batch: list[tuple[int, int, int, Any, Any]]) -> None:
    dec = Decoder()
    for t, d, i, p, _ in batch:
        dec.feed(encode_bytes(t, d, i, p))
    got = list(dec)
    assert [(m.type, m.id) for m in got] == [(t, i) for t, _d, i, _p, _e in batch]


# -- property 3: byte-identical to verda-io -------------------------------------------------


def verda_frame(msg_type: int, dtype: int, msg_id: int, payload: Any) -> bytes:
    message = {"id": msg_id, "message_type": int(msg_type), "data_type": int(dtype),
               "timestamp": None, "payload": payload}
    body = pack_message_with_time(message)
    header = SocketTransport.create_header(None, len(body), msg_type, dtype)  # type: ignore[arg-type]
    return header + body


def mask_timestamp(frame: bytes) -> bytes:
    at = frame.index(TS_MARK) + len(TS_MARK)
    return frame[:at] + b"\x00" * 12 + frame[at + 12 :]


@PROPS
@given(message=messages())
def test_bytes_equal_verda_io(message: tuple[int, int, int, Any, Any]) -> None:
    msg_type, dtype, msg_id, payload, _ = message
    if msg_id < 0:
        msg_id = -msg_id  # both sides encode any int alike; keep verda's usual ids
    if isinstance(payload, Packed):
        theirs_payload: Any = msgpack.packb(payload.value, use_bin_type=True)
    elif isinstance(payload, memoryview | bytearray):
        theirs_payload = bytes(payload)
    else:
        theirs_payload = payload
    ours = encode_bytes(msg_type, dtype, msg_id, payload)
    theirs = verda_frame(msg_type, dtype, msg_id, theirs_payload)
    assert len(ours) == len(theirs)
    assert mask_timestamp(ours) == mask_timestamp(theirs)
