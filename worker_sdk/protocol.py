"""The verda-io 0.4.4 wire protocol and vramtui's negotiated extensions, as a sans-I/O codec.

Owns the byte layout of every frame that crosses a worker or control socket: a 12-byte header
(uint64 big-endian body length, message type, data type, two reserved bytes) followed by a
msgpack map ``{id, message_type, data_type, timestamp, payload}``.  Nothing here touches a
socket: :class:`Decoder` takes bytes (``feed``, or ``get_buffer``/``buffer_updated`` for
zero-copy ``recv_into``) and yields :class:`Message` objects; :func:`encode` takes a message and
returns a list of buffers ready for ``socket.sendmsg`` (large payloads are passed through
uncopied).

Hostile input never escapes as anything but :class:`ProtocolError`.  A *fatal* error (frame too
large, unknown type code) poisons the decoder: the connection must be closed.  A non-fatal one
(a well-framed body that is not what the protocol allows) consumes exactly that frame, so the
stream stays in sync and the I/O layer may answer the one bad request and carry on.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

__all__ = [
    "ACK_FEATURES_KEY",
    "DEFAULT_MAX_FRAME",
    "EXTENSIONS",
    "HEADER_SIZE",
    "DataType",
    "Decoder",
    "EventType",
    "FrameTooLarge",
    "Message",
    "MessageType",
    "Packed",
    "ProtocolError",
    "encode",
    "encode_bytes",
    "features_from_ack",
    "features_from_registration",
    "format_features",
    "registration_payload",
]

HEADER = struct.Struct(">QBBH")
HEADER_SIZE = HEADER.size  # 12
DEFAULT_MAX_FRAME = 256 * 1024 * 1024
# Payloads at least this large are handed to sendmsg as their own buffer instead of copied.
_ZERO_COPY_MIN = 16 * 1024
_GO_TIME = struct.Struct(">qi")  # Go-style time: int64 seconds, int32 nanoseconds


class MessageType(IntEnum):
    REGISTRATION = 0
    ACKNOWLEDGEMENT = 1
    REQUEST = 2
    RESPONSE = 3
    EVENT = 4
    PING = 5
    PONG = 6
    DATA = 7
    ERROR = 8


class DataType(IntEnum):
    DEFAULT = 0
    VECTOR = 1
    STREAM = 2
    ENVELOPE = 3


class EventType(IntEnum):
    EMPTY = 0
    NOTIFY = 1
    CANCEL = 2
    SHUTDOWN = 3
    RESTART = 4
    STATUS = 5


_MESSAGE_TYPES = frozenset(int(t) for t in MessageType)
_DATA_TYPES = frozenset(int(t) for t in DataType)

# --- extensions ---------------------------------------------------------------------------
# Advertised as comma-separated strings so a Go peer that reads metadata as map[string]string
# still decodes the registration.  Used only when both ends advertised a feature.
EXTENSIONS: frozenset[str] = frozenset(
    {
        "stream",  # DATA/STREAM chunks and an explicit end of stream (payload nil)
        "cancel",  # EVENT CANCEL {request: wire id} honoured per request
        "progress",  # EVENT NOTIFY {request, fraction, message} from worker to server
        "envelope",  # DATA/ENVELOPE request {payload, request_id, metadata, deadline}
        "error-status",  # ERROR {error, type, status_code}
        "init-failure",  # EVENT STATUS {status: "failed", error} before a non-zero exit
        "quiet-status",  # no busy/ready status event around every request
    }
)
REGISTRATION_FEATURES_KEY = "vramtui-features"
REGISTRATION_VERSION_KEY = "vramtui-protocol"
ACK_FEATURES_KEY = "vramtui-features"
PROTOCOL_VERSION = "1"


def format_features(features: frozenset[str] | set[str]) -> str:
    return ",".join(sorted(features))


def _parse_features(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(f.strip() for f in value.split(",") if f.strip()) & EXTENSIONS
    if isinstance(value, list | tuple):
        return frozenset(str(f) for f in value) & EXTENSIONS
    return frozenset()


def registration_payload(name: str, features: frozenset[str] = EXTENSIONS) -> dict[str, Any]:
    """The REGISTRATION payload of a worker: verda-io's, plus our features in its metadata."""
    metadata: dict[str, str] = {"language": "python", "version": "1.0"}
    if features:
        metadata[REGISTRATION_VERSION_KEY] = PROTOCOL_VERSION
        metadata[REGISTRATION_FEATURES_KEY] = format_features(features)
    return {"identifier": name, "type": "ml_worker", "metadata": metadata}


def features_from_registration(payload: object) -> frozenset[str]:
    """The extensions a registering worker advertised (empty for a plain verda-io worker)."""
    if not isinstance(payload, dict):
        return frozenset()
    metadata = payload.get("metadata")
    if not isinstance(metadata, dict):
        return frozenset()
    return _parse_features(metadata.get(REGISTRATION_FEATURES_KEY))


def features_from_ack(payload: object) -> frozenset[str]:
    """The extensions a server advertised in its ACKNOWLEDGEMENT (empty for a plain server)."""
    if not isinstance(payload, dict):
        return frozenset()
    return _parse_features(payload.get(ACK_FEATURES_KEY))


# --- messages ---------------------------------------------------------------------------------


class ProtocolError(Exception):
    """Input that the protocol does not allow.

    ``fatal`` errors leave the byte stream unusable; others consumed exactly one frame, whose
    ``message_id`` (when it could be read) lets the receiver answer that one request.
    """

    def __init__(self, message: str, *, fatal: bool, message_id: int | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.message_id = message_id


class FrameTooLarge(ProtocolError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(
            f"frame of {length} bytes exceeds the maximum frame size of {limit} bytes",
            fatal=True,
        )
        self.length = length
        self.limit = limit


@dataclass(slots=True)
class Message:
    """One decoded frame.  ``timestamp`` is seconds since the epoch, or None if absent/odd."""

    type: int
    data_type: int
    id: int
    payload: Any
    timestamp: float | None = None


@dataclass(slots=True, frozen=True)
class Packed:
    """A payload field holding the msgpack encoding of ``value`` as bin (verda's envelope)."""

    value: Any


# --- encoding ---------------------------------------------------------------------------------

_KEY_ID = b"\xa2id"
_KEY_MSG_TYPE = b"\xacmessage_type"
_KEY_DATA_TYPE = b"\xa9data_type"
_KEY_TIMESTAMP = b"\xa9timestamp"
_KEY_PAYLOAD = b"\xa7payload"
_EXT_GO_TIME = b"\xc7\x0c\xff"  # ext8, 12 bytes, type -1
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _bin_header(n: int) -> bytes:
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    if n < 0x100000000:
        return b"\xc6" + n.to_bytes(4, "big")
    raise ValueError(f"a bin of {n} bytes is larger than msgpack allows (4 GiB)")


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


# Type tuples, not ``X | Y``: a union written inside a function is rebuilt on every call.
_BYTES_LIKE = (bytes, bytearray, memoryview)
_SPECIAL = (Packed, memoryview)


def _needs_parts(value: Any) -> bool:
    """Whether ``value`` holds something msgpack cannot pack alone: Packed, or a large bin."""
    cls = type(value)
    if cls is bytes or cls is bytearray:
        return len(value) >= _ZERO_COPY_MIN
    if isinstance(value, _SPECIAL):
        return True
    if isinstance(value, dict):
        for v in value.values():
            if _needs_parts(v):
                return True
    return False


def _pack_into(value: Any, parts: list[bytes | memoryview]) -> None:
    """Append the msgpack encoding of ``value``; large bins stay uncopied as their own part."""
    if type(value) is bytes and len(value) < _ZERO_COPY_MIN:
        parts.append(_packb(value))  # the common small reply
    elif isinstance(value, _BYTES_LIKE):
        n = value.nbytes if isinstance(value, memoryview) else len(value)
        if n >= _ZERO_COPY_MIN:
            parts.append(_bin_header(n))
            parts.append(value)
        else:
            parts.append(_packb(bytes(value) if isinstance(value, memoryview) else value))
    elif isinstance(value, Packed):
        inner: list[bytes | memoryview] = []
        _pack_into(value.value, inner)
        parts.append(_bin_header(sum(_nbytes(p) for p in inner)))
        parts.extend(inner)
    elif isinstance(value, dict) and _needs_parts(value):
        parts.append(_map_header(len(value)))
        for k, v in value.items():
            parts.append(_packb(k))
            _pack_into(v, parts)
    else:
        parts.append(_packb(value))


def _nbytes(part: bytes | memoryview) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _go_time(now_ns: int | None = None) -> bytes:
    ns = time.time_ns() if now_ns is None else now_ns
    return _EXT_GO_TIME + _GO_TIME.pack(ns // 1_000_000_000, ns % 1_000_000_000)


def encode(
    msg_type: int,
    data_type: int,
    msg_id: int,
    payload: Any,
    *,
    now_ns: int | None = None,
) -> list[bytes | memoryview]:
    """Encode one frame as a list of buffers (for ``sendmsg``); large bins are not copied."""
    head = b"".join(
        (
            b"\x85",
            _KEY_ID,
            _packb(msg_id),
            _KEY_MSG_TYPE,
            _packb(int(msg_type)),
            _KEY_DATA_TYPE,
            _packb(int(data_type)),
            _KEY_TIMESTAMP,
            _go_time(now_ns),
            _KEY_PAYLOAD,
        )
    )
    header = HEADER.pack
    if type(payload) is bytes and len(payload) < _ZERO_COPY_MIN:  # fast path: one small bin
        body = head + _packb(payload)
        return [header(len(body), int(msg_type), int(data_type), 0) + body]
    parts: list[bytes | memoryview] = []
    _pack_into(payload, parts)
    # Coalesce every small part so the common case is a single buffer.
    out: list[bytes | memoryview] = []
    pending: list[bytes | memoryview] = [head]
    for part in parts:
        if _nbytes(part) < _ZERO_COPY_MIN:
            pending.append(part)
        else:
            out.append(b"".join(pending))
            out.append(part)
            pending = []
    if pending:
        out.append(b"".join(pending))
    body_len = sum(_nbytes(p) for p in out)
    out[0] = header(body_len, int(msg_type), int(data_type), 0) + out[0]
    return out


def encode_bytes(msg_type: int, data_type: int, msg_id: int, payload: Any) -> bytes:
    """:func:`encode`, joined into one bytes object."""
    return b"".join(encode(msg_type, data_type, msg_id, payload))


# --- decoding ---------------------------------------------------------------------------------


# msgpack ext forms: first byte -> offset of the ext type byte from it.
_EXT_TYPE_OFFSET = {0xD4: 1, 0xD5: 1, 0xD6: 1, 0xD7: 1, 0xD8: 1, 0xC7: 2, 0xC8: 3, 0xC9: 5}


def _read_timestamp(body: memoryview) -> tuple[float | None, int]:
    """Read the timestamp leniently from the raw body; return (seconds, offset of its ext type).

    The offset is -1 unless the field is an ext of type -1 (any length), whose type byte the
    caller may neutralise when msgpack itself refuses the value: Go-style 12-byte times
    (nanoseconds second) and any other odd time value must never fail a frame.
    """
    idx = bytes(body[:80]).find(_KEY_TIMESTAMP)
    if idx < 0:
        return None, -1
    at = idx + len(_KEY_TIMESTAMP)
    if bytes(body[at : at + 3]) == _EXT_GO_TIME and at + 15 <= len(body):  # the usual case
        seconds, nanos = _GO_TIME.unpack_from(body, at + 3)  # Go: int64 s, then int32 ns
        return seconds + nanos / 1e9, at + 2
    end = len(body)
    if at >= end:
        return None, -1
    tag = body[at]
    offset = _EXT_TYPE_OFFSET.get(tag)
    if offset is None:
        return None, -1
    type_at = at + offset
    if type_at >= end or body[type_at] != 0xFF:
        return None, -1
    if tag == 0xC7:
        if body[at + 1] == _GO_TIME.size and type_at + 1 + _GO_TIME.size <= end:
            seconds, nanos = _GO_TIME.unpack_from(body, type_at + 1)  # Go: int64 s, int32 ns
            return seconds + nanos / 1e9, type_at
    elif tag == 0xD6:  # timestamp32
        if type_at + 5 <= end:
            return float(int.from_bytes(body[type_at + 1 : type_at + 5], "big")), type_at
    elif tag == 0xD7 and type_at + 9 <= end:  # timestamp64: nsec30 | sec34
        raw = int.from_bytes(body[type_at + 1 : type_at + 9], "big")
        return (raw & 0x3_FFFF_FFFF) + (raw >> 34) / 1e9, type_at
    return None, type_at


def _unpack(body: memoryview) -> Any:
    return msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)


def _describe(value: object) -> str:
    return "nil" if value is None else type(value).__name__


class Decoder:
    """Bytes in, :class:`Message` objects out.  One instance per connection.

    Feed bytes with :meth:`feed`, or receive straight into the decoder's buffer with
    :meth:`get_buffer` then :meth:`buffer_updated` (the asyncio ``BufferedProtocol`` shape);
    then call :meth:`next` (or iterate) until it returns None.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray(64 * 1024)
        self._start = 0
        self._end = 0
        self._need = HEADER_SIZE  # bytes the frame being read needs in all (header + body)
        self._fatal: ProtocolError | None = None

    # -- input ---------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        view = self.get_buffer(n)
        view[:n] = data
        view.release()
        self.buffer_updated(n)

    def get_buffer(self, sizehint: int = 64 * 1024) -> memoryview:
        """A writable view of at least ``sizehint`` free bytes (more when a frame needs it).

        Release the view (or let it go) before calling anything else on the decoder.
        """
        want = max(sizehint, 1024, self._need - (self._end - self._start))
        if len(self._buf) - self._end < want:
            self._make_room(want)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes

    def _make_room(self, want: int) -> None:
        unread = self._end - self._start
        if self._start and len(self._buf) - unread >= want:
            self._buf[:unread] = self._buf[self._start : self._end]
        else:
            grown = bytearray(max(len(self._buf) * 2, unread + want))
            grown[:unread] = self._buf[self._start : self._end]
            self._buf = grown
        self._start, self._end = 0, unread

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded."""
        return self._end - self._start

    # -- output --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        while (message := self.next()) is not None:
            yield message

    def next(self) -> Message | None:
        """The next complete message, None when more bytes are needed; raises ProtocolError."""
        if self._fatal is not None:
            raise self._fatal
        available = self._end - self._start
        if available < HEADER_SIZE:
            return None
        length, msg_type, data_type, _reserved = HEADER.unpack_from(self._buf, self._start)
        if length > self.max_frame_size:
            self._fatal = FrameTooLarge(length, self.max_frame_size)
            raise self._fatal
        if msg_type not in _MESSAGE_TYPES or data_type not in _DATA_TYPES:
            self._fatal = ProtocolError(
                f"unknown type code in frame header (message type {msg_type}, "
                f"data type {data_type})",
                fatal=True,
            )
            raise self._fatal
        total = HEADER_SIZE + length
        if available < total:
            self._need = total
            return None
        body_start = self._start + HEADER_SIZE
        self._start += total
        self._need = HEADER_SIZE
        with memoryview(self._buf) as whole, whole[body_start : body_start + length] as body:
            message = self._decode_body(body, msg_type, data_type)
        if self._start == self._end:
            self._start = self._end = 0
        return message

    def _decode_body(self, body: memoryview, msg_type: int, data_type: int) -> Message:
        timestamp, ext_at = _read_timestamp(body)
        try:
            obj = _unpack(body)
        except ValueError as exc:
            # msgpack refuses time values that are not valid for it (Go-style ones among
            # them); decode the frame with that one ext made opaque rather than failing it.
            if ext_at < 0:
                raise ProtocolError(f"malformed msgpack body: {exc}", fatal=False) from None
            patched = bytearray(body)
            patched[ext_at] = 0x01
            try:
                obj = _unpack(memoryview(patched))
            except Exception as exc2:  # noqa: BLE001 - any msgpack failure is a protocol error
                raise ProtocolError(f"malformed msgpack body: {exc2}", fatal=False) from None
        except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
            raise ProtocolError(f"malformed msgpack body: {exc}", fatal=False) from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"frame body is {_describe(obj)}, not a map", fatal=False)
        msg_id = obj.get("id", 0)
        if not isinstance(msg_id, int) or isinstance(msg_id, bool):
            raise ProtocolError(f"frame id is {_describe(msg_id)}, not an int", fatal=False)
        payload = obj.get("payload")
        _check_payload(msg_type, data_type, msg_id, payload)
        return Message(msg_type, data_type, msg_id, payload, timestamp)


_BYTES_OR_MAP = (bytes, dict)
_MAP_PAYLOAD_TYPES = frozenset(
    {MessageType.EVENT, MessageType.REGISTRATION, MessageType.ACKNOWLEDGEMENT}
)


def _check_payload(msg_type: int, data_type: int, msg_id: int, payload: object) -> None:
    """Reject payloads of the wrong kind for their message type (the frame is consumed)."""
    problem: str | None = None
    if msg_type == MessageType.DATA:
        if data_type == DataType.ENVELOPE:
            if not isinstance(payload, _BYTES_OR_MAP):
                problem = f"DATA envelope payload must be bin or map, got {_describe(payload)}"
            elif isinstance(payload, dict) and not isinstance(payload.get("payload"), bytes):
                problem = "DATA envelope map must carry its payload as bin"
        elif data_type == DataType.STREAM:
            if payload is not None and not isinstance(payload, bytes):
                problem = f"DATA stream payload must be bin or nil, got {_describe(payload)}"
        elif not isinstance(payload, bytes):
            problem = f"DATA payload must be bin, got {_describe(payload)}"
    elif msg_type in _MAP_PAYLOAD_TYPES and not isinstance(payload, dict):
        problem = f"{MessageType(msg_type).name} payload must be a map, got {_describe(payload)}"
    if problem is not None:
        raise ProtocolError(problem, fatal=False, message_id=msg_id)


def event_type(payload: Mapping[str, Any]) -> int:
    """The event code of an EVENT payload (verda's Go server may spell the key ``Event``)."""
    value = payload.get("event", payload.get("Event", 0))
    return value if isinstance(value, int) else -1
