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
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

__all__ = [
    "ACK_FEATURES_KEY",
    "DEFAULT_MAX_FRAME",
    "CAPABILITIES",
    "EXTENSIONS",
    "HEADER_SIZE",
    "KNOWN_FEATURES",
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
    "parse_features",
    "registration_payload",
]

HEADER = struct.Struct(">QBBH")
HEADER_SIZE = HEADER.size  # 12
DEFAULT_MAX_FRAME = 256 * 1024 * 1024
# Payloads at least this large are handed to sendmsg as their own buffer instead of copied.
_ZERO_COPY_MIN = 16 * 1024
_time_ns = time.time_ns
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
        "data-progress",  # ... sent on the data socket, in order with the request's chunks
        "envelope",  # DATA/ENVELOPE request {payload, request_id, metadata, deadline}
        "error-status",  # ERROR {error, type, status_code}
        "init-failure",  # EVENT STATUS {status: "failed", error} before a non-zero exit
        "quiet-status",  # no busy/ready status event around every request
    }
)
# What a worker *can do*, as opposed to how it talks: advertised only by a worker that can (a
# worker with ``@worker_sdk.sleep`` and ``@worker_sdk.wake`` offers "sleep"), acknowledged by a
# server that uses it, never required of anyone.
CAPABILITIES: frozenset[str] = frozenset(
    {
        "sleep",  # REQUEST {type: sleep, level} / {type: wake} on the data socket, answered
        # by a RESPONSE {status: asleep | awake | error, ...} there: the memory given back
        # while the process stays alive, and taken again
    }
)
KNOWN_FEATURES: frozenset[str] = EXTENSIONS | CAPABILITIES
REGISTRATION_FEATURES_KEY = "vramtui-features"
REGISTRATION_VERSION_KEY = "vramtui-protocol"
ACK_FEATURES_KEY = "vramtui-features"
PROTOCOL_VERSION = "1"


def format_features(features: frozenset[str] | set[str]) -> str:
    return ",".join(sorted(features))


def parse_features(value: object) -> frozenset[str]:
    """The known extensions and capabilities named in ``value`` (a comma-separated str, or a
    list)."""
    if isinstance(value, str):
        return frozenset(f.strip() for f in value.split(",") if f.strip()) & KNOWN_FEATURES
    if isinstance(value, list | tuple):
        return frozenset(str(f) for f in value) & KNOWN_FEATURES
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
    return parse_features(metadata.get(REGISTRATION_FEATURES_KEY))


def features_from_ack(payload: object) -> frozenset[str]:
    """The extensions a server advertised in its ACKNOWLEDGEMENT (empty for a plain server)."""
    if not isinstance(payload, dict):
        return frozenset()
    return parse_features(payload.get(ACK_FEATURES_KEY))


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
_MAP5_ID = b"\x85" + _KEY_ID  # a body starts with a map of 5, then its id
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


# The fixed middle of every body, per (message type, data type): the two type fields and the
# start of the timestamp ext.
_MIDDLES: dict[tuple[int, int], bytes] = {}


def _middle(msg_type: int, data_type: int) -> bytes:
    key = (msg_type, data_type)
    middle = _MIDDLES.get(key)
    if middle is None:
        middle = b"".join((_KEY_MSG_TYPE, _packb(int(msg_type)), _KEY_DATA_TYPE,
                           _packb(int(data_type)), _KEY_TIMESTAMP, _EXT_GO_TIME))
        if len(_MIDDLES) < 4096:
            _MIDDLES[key] = middle
    return middle


def encode_small_bin(msg_type: int, data_type: int, msg_id: int, payload: bytes) -> bytes:
    """One frame whose payload is ``bytes`` shorter than 16 KiB, as one bytes object.

    The same bytes as :func:`encode` (which calls it), with nothing in between: a worker's
    small reply takes this path.
    """
    ns = _time_ns()
    body = b"".join((_MAP5_ID, _packb(msg_id),
                     _MIDDLES.get((msg_type, data_type)) or _middle(msg_type, data_type),
                     _GO_TIME.pack(ns // 1_000_000_000, ns % 1_000_000_000), _KEY_PAYLOAD,
                     _packb(payload)))
    return _pack_header(len(body), msg_type, data_type, 0) + body


SMALL_BIN = 16 * 1024  # below this, encode_small_bin applies


def encode(
    msg_type: int,
    data_type: int,
    msg_id: int,
    payload: Any,
    *,
    now_ns: int | None = None,
) -> list[bytes | memoryview]:
    """Encode one frame as a list of buffers (for ``sendmsg``); large bins are not copied."""
    if type(payload) is bytes and len(payload) < _ZERO_COPY_MIN and now_ns is None:
        return [encode_small_bin(msg_type, data_type, msg_id, payload)]
    ns = time.time_ns() if now_ns is None else now_ns
    head = b"".join((_MAP5_ID, _packb(msg_id), _middle(msg_type, data_type),
                     _GO_TIME.pack(ns // 1_000_000_000, ns % 1_000_000_000), _KEY_PAYLOAD))
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


# First byte of the packed id -> offset of the timestamp value from the body's start:
# 0x85 "\xa2id" (4) + id + "\xacmessage_type" (13) + 1 + "\xa9data_type" (10) + 1 +
# "\xa9timestamp" (10).
_TS_AFTER_ID = {
    tag: 4 + size + 13 + 1 + 10 + 1 + 10
    for size, tags in ((1, range(0x80)), (1, range(0xE0, 0x100)), (2, (0xCC, 0xD0)),
                       (3, (0xCD, 0xD1)), (5, (0xCE, 0xD2)), (9, (0xCF, 0xD3)))
    for tag in tags
}


def _read_timestamp(buf: bytearray, start: int, end: int) -> tuple[float | None, int]:
    """Read the timestamp of the body ``buf[start:end]`` leniently, without copying it.

    Returns (seconds, offset in ``buf`` of its ext type byte).  The offset is -1 unless the
    field is an ext of type -1 (any length), whose type byte the caller may neutralise when
    msgpack itself refuses the value: Go-style 12-byte times (nanoseconds second) and any
    other odd time value must never fail a frame.
    """
    # Where the field is in verda-io's key order (id, message_type, data_type, timestamp)
    # with one-byte type codes: after an id of 1, 2, 3, 5 or 9 bytes.  Else, look for it.
    at = start + _TS_AFTER_ID.get(buf[start + 4], 0) if end - start > 40 else 0
    if not (at and buf.startswith(_KEY_TIMESTAMP, at - len(_KEY_TIMESTAMP))):
        idx = buf.find(_KEY_TIMESTAMP, start, min(start + 80, end))
        if idx < 0:
            return None, -1
        at = idx + len(_KEY_TIMESTAMP)
    if at + 15 <= end and buf.startswith(_EXT_GO_TIME, at):  # the usual case
        seconds, nanos = _GO_TIME.unpack_from(buf, at + 3)  # Go: int64 s, then int32 ns
        return seconds + nanos / 1e9, at + 2
    if at >= end:
        return None, -1
    tag = buf[at]
    offset = _EXT_TYPE_OFFSET.get(tag)
    if offset is None:
        return None, -1
    type_at = at + offset
    if type_at >= end or buf[type_at] != 0xFF:
        return None, -1
    if tag == 0xC7:
        if buf[at + 1] == _GO_TIME.size and type_at + 1 + _GO_TIME.size <= end:
            seconds, nanos = _GO_TIME.unpack_from(buf, type_at + 1)  # Go: int64 s, int32 ns
            return seconds + nanos / 1e9, type_at
    elif tag == 0xD6:  # timestamp32
        if type_at + 5 <= end:
            return float(int.from_bytes(buf[type_at + 1 : type_at + 5], "big")), type_at
    elif tag == 0xD7 and type_at + 9 <= end:  # timestamp64: nsec30 | sec34
        raw = int.from_bytes(buf[type_at + 1 : type_at + 9], "big")
        return (raw & 0x3_FFFF_FFFF) + (raw >> 34) / 1e9, type_at
    return None, type_at


_unpackb = msgpack.unpackb


def _unpack(body: memoryview | bytearray) -> Any:
    # timestamp=2: a time ext becomes an int in C, not a Timestamp built in Python (we read
    # the frame's own timestamp ourselves, and nobody uses msgpack's reading of it).
    return _unpackb(body, raw=False, strict_map_key=False, use_list=True, timestamp=2)


def _describe(value: object) -> str:
    return "nil" if value is None else type(value).__name__


# A frame larger than this is received into a buffer that grows with the bytes that actually
# arrived (at most doubling them), not with the length its header claims; a buffer grown past
# it is dropped once empty, so one large frame does not pin its memory for good.
GROW_STEP = 4 * 1024 * 1024
_INITIAL_BUFFER = 64 * 1024


class Decoder:
    """Bytes in, :class:`Message` objects out.  One instance per connection.

    Feed bytes with :meth:`feed`, or receive straight into the decoder's buffer with
    :meth:`get_buffer` then :meth:`buffer_updated` (the asyncio ``BufferedProtocol`` shape);
    then call :meth:`next` (or iterate) until it returns None.

    Memory: a frame's header is trusted for nothing but its limit.  The buffer holds at most
    about twice the bytes received of the frame in progress (plus :data:`GROW_STEP`), and
    never more than ``max_frame_size`` plus that step.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME, *,
                 timestamps: bool = True) -> None:
        self.max_frame_size = max_frame_size
        self.timestamps = timestamps  # read each frame's timestamp (else Message.timestamp None)
        self._buf = bytearray(_INITIAL_BUFFER)
        self._start = 0
        self._end = 0
        self._need = HEADER_SIZE  # bytes the frame being read needs in all (header + body)
        self._fatal: ProtocolError | None = None

    # -- input ---------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` (already in memory: it is copied once, whatever the frame claims)."""
        n = len(data)
        if len(self._buf) - self._end < n:
            self._make_room(n)
        self._buf[self._end : self._end + n] = data
        self._end += n

    def get_buffer(self, sizehint: int = 64 * 1024) -> memoryview:
        """A writable view of at least ``sizehint`` free bytes (more when a frame needs it).

        Release the view (or let it go) before calling anything else on the decoder.
        """
        end = self._end
        if len(self._buf) - end >= sizehint and self._need - (end - self._start) <= sizehint:
            return memoryview(self._buf)[end:]  # the usual case: room enough already
        buffered = end - self._start
        missing = self._need - buffered
        if missing > GROW_STEP:  # a large frame: grow with what arrived, not what it claims
            missing = max(GROW_STEP, buffered)
        want = max(sizehint, 1024, missing)
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

    @property
    def capacity(self) -> int:
        """Bytes this decoder holds allocated (its buffer)."""
        return len(self._buf)

    # -- output --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        while (message := self.next()) is not None:
            yield message

    def next(self) -> Message | None:
        """The next complete message, None when more bytes are needed; raises ProtocolError."""
        frame = self.take()
        if frame is None:
            return None
        return self.decode(*frame)

    def take(self) -> tuple[int, int, bytearray, int, int] | None:
        """The next complete frame, undecoded: (message type, data type, buffer, start, end).

        The body is ``buffer[start:end]``; read it (with :meth:`decode`, or by hand) before
        giving the decoder more bytes.  None when more bytes are needed; a header the protocol
        does not allow raises (fatal).
        """
        if self._fatal is not None:
            raise self._fatal
        start = self._start
        available = self._end - start
        if available < HEADER_SIZE:
            return None
        length, msg_type, data_type, _reserved = _unpack_header(self._buf, start)
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
        buf = self._buf
        body_start = start + HEADER_SIZE
        body_end = body_start + length
        self._need = HEADER_SIZE
        if body_end == self._end:  # all consumed: start over (the body stays where it is)
            self._start = self._end = 0
            if len(buf) > GROW_STEP:  # let a large frame's memory go
                self._buf = bytearray(_INITIAL_BUFFER)
        else:
            self._start = body_end
        return msg_type, data_type, buf, body_start, body_end

    def decode(self, msg_type: int, data_type: int, buf: bytearray, start: int,
               end: int) -> Message:
        """The :class:`Message` of a frame from :meth:`take` (non-fatal ProtocolError)."""
        return self._decode_body(buf, start, end, msg_type, data_type)

    def _decode_body(self, buf: bytearray, start: int, end: int, msg_type: int,
                     data_type: int) -> Message:
        if msg_type == 7:  # DATA: most often a bin in the layout verda-io and we write
            found = canonical_payload_at(buf, start, end, msg_type, data_type)
            if found is not None:
                payload = read_bin(buf, found[1], end)
                if payload is not None:
                    timestamp = None
                    if self.timestamps:
                        seconds, nanos = _GO_TIME.unpack_from(buf, found[1] - _TIME_BACK)
                        timestamp = seconds + nanos / 1e9
                    return Message(msg_type, data_type, found[0], payload, timestamp)
        timestamp = None
        if self.timestamps:
            timestamp, _ext_at = _read_timestamp(buf, start, end)
        try:
            if end - start <= _COPY_BODY_MAX:  # a small copy costs less than a memoryview
                obj = _unpack(buf[start:end])
            else:
                with memoryview(buf) as whole, whole[start:end] as body:
                    obj = _unpack(body)
        except ValueError as exc:
            obj = self._decode_odd_time(buf, start, end, exc)
        except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
            raise ProtocolError(f"malformed msgpack body: {exc}", fatal=False) from None
        if type(obj) is not dict:
            raise ProtocolError(f"frame body is {_describe(obj)}, not a map", fatal=False)
        msg_id = obj.get("id", 0)
        if type(msg_id) is not int:
            raise ProtocolError(f"frame id is {_describe(msg_id)}, not an int", fatal=False)
        payload = obj.get("payload")
        if msg_type != 7 or data_type != 0 or type(payload) is not bytes:  # (the common case)
            _check_payload(msg_type, data_type, msg_id, payload)
        return Message(msg_type, data_type, msg_id, payload, timestamp)

    @staticmethod
    def _decode_odd_time(buf: bytearray, start: int, end: int, exc: ValueError) -> Any:
        """msgpack refuses time values that are not valid for it (Go-style ones among them):
        decode the frame with that one ext made opaque rather than failing it."""
        _timestamp, ext_at = _read_timestamp(buf, start, end)
        if ext_at < 0:
            raise ProtocolError(f"malformed msgpack body: {exc}", fatal=False) from None
        patched = bytearray(buf[start:end])
        patched[ext_at - start] = 0x01
        try:
            return _unpack(patched)
        except Exception as exc2:  # noqa: BLE001 - any msgpack failure is a protocol error
            raise ProtocolError(f"malformed msgpack body: {exc2}", fatal=False) from None


_COPY_BODY_MAX = 4096
_KEY_PAYLOAD_LEN = len(_KEY_PAYLOAD)
_TIME_BACK = _KEY_PAYLOAD_LEN + _GO_TIME.size  # from the payload value back to the time


def canonical_payload_at(buf: bytearray, start: int, end: int, msg_type: int,
                         data_type: int) -> tuple[int, int] | None:
    """(id, offset of the payload value) of a body ``buf[start:end]`` laid out exactly as
    verda-io and we write it — keys id (a non-negative int), message_type, data_type,
    timestamp (a 12-byte ext right after its key), payload, in that order — else None.

    With :func:`read_bin` this reads what msgpack would, at a fraction of the cost: the
    request and reply path of every worker spends its time here.  The frame's time is the
    12 bytes before the payload key.
    """
    if end - start < 45 or not buf.startswith(_MAP5_ID, start):
        return None
    tag = buf[start + 4]
    if tag < 0x80:  # positive fixint
        msg_id, at = tag, start + 5
    elif tag == 0xCC:
        msg_id, at = buf[start + 5], start + 6
    elif tag == 0xCD:
        msg_id, at = int.from_bytes(buf[start + 5 : start + 7], "big"), start + 7
    elif tag == 0xCE:
        msg_id, at = int.from_bytes(buf[start + 5 : start + 9], "big"), start + 9
    else:
        return None
    middle = _middle(msg_type, data_type)
    if not buf.startswith(middle, at):
        return None
    at += len(middle) + _GO_TIME.size
    if not buf.startswith(_KEY_PAYLOAD, at):
        return None
    return msg_id, at + _KEY_PAYLOAD_LEN


def read_bin(buf: bytearray, at: int, end: int) -> bytes | None:
    """The msgpack bin at ``buf[at]`` if it ends exactly at ``end``, else None."""
    if at >= end:
        return None
    tag = buf[at]
    if tag == 0xC4:
        n, at = buf[at + 1], at + 2
    elif tag == 0xC5:
        n, at = int.from_bytes(buf[at + 1 : at + 3], "big"), at + 3
    elif tag == 0xC6:
        n, at = int.from_bytes(buf[at + 1 : at + 5], "big"), at + 5
    else:
        return None
    if at + n != end:
        return None
    if n <= _COPY_BODY_MAX:
        return bytes(buf[at:end])
    with memoryview(buf) as whole:  # one copy of a large payload, not two
        return whole[at:end].tobytes()


_unpack_header = HEADER.unpack_from
_pack_header = HEADER.pack


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
