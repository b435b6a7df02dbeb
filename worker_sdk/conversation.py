"""The conversation over one worker socket, sans I/O: handshake, typed messages, validation.

:mod:`worker_sdk.protocol` owns the frames (bytes <-> :class:`~worker_sdk.protocol.Message`);
this module owns what the frames *mean*, for both ends, in one place:

- :class:`WorkerConversation` is a worker's end of its control or data socket, and
  :class:`ServerConversation` a server's (the engine's, or the test server's).
- ``receive_data`` (or ``get_buffer``/``buffer_updated`` for zero-copy receives) takes bytes;
  ``next_event`` returns the next typed message of :mod:`worker_sdk.events`, None when more
  bytes are needed, or raises :class:`~worker_sdk.protocol.ProtocolError` for input the
  protocol does not allow.  ``send(event)`` returns the buffers to write.
- The handshake: a server refuses everything before a valid REGISTRATION, and answers it with
  :meth:`ServerConversation.acknowledge`; features are those both ends advertised.
- Sleep (the capability ``sleep``, only when both ends advertised it): a server's
  :class:`~worker_sdk.events.SleepRequest` or :class:`~worker_sdk.events.WakeRequest` is a
  REQUEST on the *data* socket (so it runs on the worker's main thread, in order with the
  requests), answered there by a RESPONSE, :class:`~worker_sdk.events.SleepReply` or
  :class:`~worker_sdk.events.WakeReply` (or an ERROR, read as a failed one).
- Every payload is checked here — types, ranges, sizes — so a hostile frame is refused before
  any caller sees it: an envelope whose payload is not bin, a status code of 2**64-1, headers
  that are not a map, a NaN fraction, an unknown event code, a registration with junk in it,
  replies to requests never made, pongs to pings never sent.
- A refusal is *fatal* (the byte stream or the handshake is unusable: close the connection) or
  not (exactly that frame was dropped; ``message_id`` names the request it concerned, when
  there is one, so the caller can fail or answer that request).  Too many refusals in a row
  become fatal, which bounds what a flood of junk can cost in logs.

A server tracks each request it sent until its reply ends: that is how a plain verda-io
worker's stream is told from a plain reply (the caller says which it expects), and how a reply
for an unknown or finished request is refused.  Nothing here reads a clock or a socket.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from enum import Enum
from typing import Any

import msgpack

from .events import (
    Acknowledgement,
    Cancel,
    Chunk,
    EndOfStream,
    EnvelopeReply,
    ErrorReply,
    Event,
    HealthReply,
    HealthRequest,
    Notice,
    Ping,
    Pong,
    Progress,
    Registration,
    Reply,
    Request,
    ServerError,
    Shutdown,
    SleepReply,
    SleepRequest,
    Status,
    StatusQuery,
    StatusReply,
    StatusRequest,
    WakeReply,
    WakeRequest,
)
from .protocol import (
    ACK_FEATURES_KEY,
    DEFAULT_MAX_FRAME,
    EXTENSIONS,
    REGISTRATION_FEATURES_KEY,
    REGISTRATION_VERSION_KEY,
    DataType,
    Decoder,
    EventType,
    Message,
    MessageType,
    Packed,
    ProtocolError,
    canonical_payload_at,
    encode,
    features_from_ack,
    format_features,
    parse_features,
    read_bin,
    registration_payload,
)

__all__ = [
    "CONTROL_MAX_FRAME",
    "MAX_REFUSED_IN_A_ROW",
    "MAX_UNANSWERED",
    "Channel",
    "LocalProtocolError",
    "ServerConversation",
    "WorkerConversation",
]

# -- limits -------------------------------------------------------------------------------------
CONTROL_MAX_FRAME = 1024 * 1024  # status, progress, health, pings: small by nature
MAX_REFUSED_IN_A_ROW = 32  # then the connection is given up (bounds logs and work)
MAX_NAME = 256
MAX_KIND = 64
MAX_STATUS = 64
MAX_ERROR_TEXT = 16 * 1024  # longer error texts are cut (an error must still get through)
MAX_PROGRESS_TEXT = 1024
MAX_REQUEST_ID = 256
MAX_HEADERS = 128
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 8 * 1024
MAX_UNANSWERED = 256  # pings or control requests outstanding at once
SLEEP_LEVELS = (1, 2)  # vLLM's: 1 keeps the weights in host memory, 2 drops them too
_U64 = 1 << 64
_I64 = 1 << 63
# Statuses a worker may report; "failed" only with the init-failure extension.
STATUSES = frozenset({"initializing", "ready", "busy"})


class Channel(Enum):
    CONTROL = "control"
    DATA = "data"


class LocalProtocolError(Exception):
    """Our own side tried to send something the conversation does not allow (a bug here)."""


def _refuse(problem: str, message_id: int | None = None) -> ProtocolError:
    return ProtocolError(problem, fatal=False, message_id=message_id)


def _kind_of(value: object) -> str:
    return "nil" if value is None else type(value).__name__


# -- value checks (each returns the clean value or raises a non-fatal ProtocolError) ----------


def _uint(value: object, what: str, message_id: int | None = None) -> int:
    if type(value) is not int or not 0 <= value < _U64:  # (bool is not int here)
        raise _refuse(f"{what} must be an unsigned 64-bit int, got {_show(value)}", message_id)
    return value


def _text(value: object, what: str, limit: int, message_id: int | None = None) -> str:
    """A str, cut to ``limit`` characters (a long message is still worth delivering)."""
    if not isinstance(value, str):
        raise _refuse(f"{what} must be str, got {_kind_of(value)}", message_id)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _name(value: object, what: str, limit: int) -> str:
    """A short identifier: non-empty str, within ``limit``, no control characters."""
    if not isinstance(value, str) or not value or len(value) > limit or \
            not value.isprintable():
        raise ProtocolError(f"{what} must be a printable str of 1 to {limit} characters, got "
                            f"{_show(value)}", fatal=True)
    return value


def _status_code(value: object, message_id: int | None) -> int:
    if type(value) is not int or not 100 <= value <= 599:
        raise _refuse(f"status_code must be an int from 100 to 599, got {_show(value)}",
                      message_id)
    return value


def _fraction(value: object, message_id: int | None) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0.0 <= value <= 1.0:  # NaN fails this too
        raise _refuse(f"progress fraction must be a number from 0 to 1 or nil, got "
                      f"{_show(value)}", message_id)
    return float(value)


def _deadline(value: object, message_id: int) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _refuse(f"deadline must be a finite number or nil, got {_show(value)}",
                      message_id)
    return float(value)


def _headers(value: object, message_id: int) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _refuse(f"headers must be a map, got {_kind_of(value)}", message_id)
    if len(value) > MAX_HEADERS:
        raise _refuse(f"{len(value)} headers (at most {MAX_HEADERS})", message_id)
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_HEADER_NAME:
            raise _refuse(f"header name {_show(key)} is not a str of 1 to "
                          f"{MAX_HEADER_NAME} characters", message_id)
        if isinstance(item, str):
            if len(item) > MAX_HEADER_VALUE:
                raise _refuse(f"header {key!r} is longer than {MAX_HEADER_VALUE} characters",
                              message_id)
        elif type(item) is int:
            if not -_I64 <= item < _I64:
                raise _refuse(f"header {key!r} is an int out of the 64-bit range", message_id)
        elif type(item) is float:
            if not math.isfinite(item):
                raise _refuse(f"header {key!r} is {item}", message_id)
        elif type(item) is not bool:
            raise _refuse(f"header {key!r} must be str, int, float or bool, got "
                          f"{_kind_of(item)}", message_id)
    return value


def _metadata(value: object, message_id: int) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _refuse(f"request metadata must be a map with str keys, got {_kind_of(value)}",
                      message_id)
    return value


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _event_code(payload: dict[str, Any], message_id: int) -> int:
    """The event code of an EVENT payload (a Go server may spell the key ``Event``)."""
    code = payload.get("event", payload.get("Event", 0))
    if type(code) is not int or code not in _EVENT_CODES:
        raise _refuse(f"unknown event code {_show(code)}", message_id)
    return code


_EVENT_CODES = frozenset(int(e) for e in EventType)


def _unpack_nested(data: bytes, message_id: int) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise _refuse(f"malformed envelope reply: {exc}", message_id) from None


# The request envelope as a server writes it when it has nothing but a request id to add:
# {request_id: str, metadata: {}, deadline: nil, payload: bin}.
_ENVELOPE_HEAD = b"\x84\xaarequest_id"
_ENVELOPE_MIDDLE = b"\xa8metadata\x80\xa8deadline\xc0\xa7payload"


def _canonical_envelope(buf: bytearray, at: int, end: int, msg_id: int) -> Request | None:
    """The :class:`Request` of an envelope in that exact layout, else None (the general
    path then decodes and checks whatever it is)."""
    if not buf.startswith(_ENVELOPE_HEAD, at):
        return None
    at += len(_ENVELOPE_HEAD)
    tag = buf[at]
    if 0xA0 <= tag <= 0xBF:
        n, at = tag & 0x1F, at + 1
    elif tag == 0xD9:
        n, at = buf[at + 1], at + 2
    else:
        return None
    if n > MAX_REQUEST_ID:
        return None
    try:
        request_id = buf[at : at + n].decode()
    except UnicodeDecodeError:
        return None
    at += n
    if not buf.startswith(_ENVELOPE_MIDDLE, at):
        return None
    payload = read_bin(buf, at + len(_ENVELOPE_MIDDLE), end)
    if payload is None:
        return None
    return Request(msg_id, payload, request_id)


# -- the common part ----------------------------------------------------------------------------


class _Conversation:
    """What both ends share: the decoder, the refusal count, ids, negotiated features."""

    def __init__(self, channel: Channel, max_frame_size: int | None) -> None:
        self.channel = channel
        if max_frame_size is None:
            max_frame_size = CONTROL_MAX_FRAME if channel is Channel.CONTROL else \
                DEFAULT_MAX_FRAME
        # Only control frames' timestamps are used (status marks): data frames skip them.
        self.decoder = Decoder(max_frame_size, timestamps=channel is Channel.CONTROL)
        self.features: frozenset[str] = frozenset()
        self._ids = itertools.count(1)  # next() is atomic: two threads may send
        self._refused = 0
        self._handlers: dict[int, Callable[[Message], Event]] = {}
        self.last_message: Message | None = None  # the frame the last event came from

        # The decoder's own input methods, unwrapped (one call less per receive).
        self.receive_data = self.decoder.feed
        self.get_buffer = self.decoder.get_buffer
        self.buffer_updated = self.decoder.buffer_updated

    # -- input -----------------------------------------------------------------------------
    receive_data: Callable[[bytes | bytearray | memoryview], None]
    get_buffer: Callable[..., memoryview]  # (sizehint=64 KiB) -> a writable view
    buffer_updated: Callable[[int], None]

    @property
    def max_frame_size(self) -> int:
        return self.decoder.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        self.decoder.max_frame_size = value

    def next_event(self) -> Event | None:
        """The next typed message; None when more bytes are needed; raises ProtocolError."""
        try:
            message = self.decoder.next()
            if message is None:
                return None
            self.last_message = message
            event = self.interpret(message)
        except ProtocolError as exc:
            self._on_refused(exc)
            raise
        self._refused = 0
        return event

    def interpret(self, message: Message) -> Event:
        """The typed meaning of one decoded frame (raises ProtocolError to refuse it)."""
        handler = self._handlers.get(message.type)
        if handler is None:
            raise _refuse(f"{MessageType(message.type).name} is not expected from a "
                          f"{self._peer} on the {self.channel.value} socket", message.id)
        return handler(message)

    def _on_refused(self, exc: ProtocolError) -> None:
        if exc.fatal:
            return
        self._refused += 1
        if self._refused > MAX_REFUSED_IN_A_ROW:
            exc.fatal = True
            exc.args = (f"{exc} (and {MAX_REFUSED_IN_A_ROW} refused frames before it in a "
                        "row: giving up on this connection)",)

    _peer = "peer"

    # -- output ----------------------------------------------------------------------------
    def next_id(self) -> int:
        return next(self._ids)

    def _needs(self, feature: str, what: str) -> None:
        if feature not in self.features:
            raise LocalProtocolError(f"{what} needs the {feature!r} extension, which was not "
                                     "negotiated on this connection")

    def _on_ping(self, message: Message) -> Ping:
        return Ping(message.id)


# -- the worker's end ---------------------------------------------------------------------------


class WorkerConversation(_Conversation):
    """A worker's end of its control or its data socket."""

    _peer = "server"

    def __init__(self, channel: Channel, *, offered: frozenset[str] = EXTENSIONS,
                 max_frame_size: int | None = None) -> None:
        super().__init__(channel, max_frame_size)
        self.offered = offered
        self.acknowledged = False
        self._handlers = {
            MessageType.ACKNOWLEDGEMENT: self._on_ack,
            MessageType.PING: self._on_ping,
        }
        if channel is Channel.CONTROL:
            self._handlers[MessageType.EVENT] = self._on_event
            self._handlers[MessageType.REQUEST] = self._on_request
        else:
            self._handlers[MessageType.DATA] = self._on_data
            self._handlers[MessageType.ERROR] = self._on_server_error
            self._handlers[MessageType.REQUEST] = self._on_sleep_request
            self.next_event = self._next_data_event  # type: ignore[method-assign]

    def adopt(self, features: frozenset[str]) -> None:
        """Use ``features`` (negotiated on the worker's other socket) on this one too."""
        self.features = self.offered & features
        self.acknowledged = True

    def registration(self, name: str) -> Registration:
        """This worker's REGISTRATION: verda-io's, plus the extensions it offers."""
        return Registration(self.next_id(), name, features=self.offered)

    # -- input -----------------------------------------------------------------------------
    def _next_data_event(self) -> Event | None:
        """:meth:`next_event` of the data socket: requests as our engine and verda's server
        write them are read straight from the bytes; anything else takes the general path."""
        frame = self.decoder.take()
        if frame is None:
            return None
        msg_type, data_type, buf, start, end = frame
        if msg_type == 7:
            found = canonical_payload_at(buf, start, end, 7, data_type)
            if found is not None:
                if data_type == 0:
                    payload = read_bin(buf, found[1], end)
                    if payload is not None:
                        self._refused = 0
                        return Request(found[0], payload)
                elif data_type == 3:
                    request = _canonical_envelope(buf, found[1], end, found[0])
                    if request is not None:
                        self._refused = 0
                        return request
        try:
            message = self.decoder.decode(msg_type, data_type, buf, start, end)
            self.last_message = message
            event = self.interpret(message)
        except ProtocolError as exc:
            self._on_refused(exc)
            raise
        self._refused = 0
        return event

    def _on_ack(self, message: Message) -> Acknowledgement:
        payload = message.payload
        ident = payload.get("identifier", payload.get("Identifier", ""))
        theirs = features_from_ack(payload)
        if not self.acknowledged:  # the first acknowledgement decides (a second one is noise)
            self.adopt(theirs)
        return Acknowledgement(message.id, ident if isinstance(ident, str) else str(ident),
                               theirs)

    def _on_event(self, message: Message) -> Event:
        code = _event_code(message.payload, message.id)
        if code == EventType.SHUTDOWN:
            return Shutdown(message.id)
        if code == EventType.STATUS:
            return StatusQuery(message.id)
        if code == EventType.CANCEL and "cancel" in self.features:
            return Cancel(message.id, _uint(message.payload.get("request"),
                                            "the request to cancel", message.id))
        return Notice(message.id, code)  # verda-io only logs these

    def _on_request(self, message: Message) -> Event:
        payload = message.payload
        if isinstance(payload, dict) and payload.get("type") == "hardware_health":
            return HealthRequest(message.id)
        return StatusRequest(message.id)  # verda-io answers any other request with its status

    def _on_data(self, message: Message) -> Request:
        payload = message.payload
        if type(payload) is bytes:  # the plain request: nothing else to look at
            if message.data_type == DataType.DEFAULT:
                return Request(message.id, payload)
        elif message.data_type == DataType.ENVELOPE:  # our envelope: {payload, request_id, ...}
            msg_id = message.id
            request_id = payload.get("request_id")
            if request_id is not None:
                if type(request_id) is int:
                    request_id = str(request_id)
                elif not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID:
                    raise _refuse(f"request_id must be a str of at most {MAX_REQUEST_ID} "
                                  f"characters, got {_show(request_id)}", msg_id)
            return Request(msg_id, payload["payload"], request_id,
                           _metadata(payload.get("metadata"), msg_id),
                           _deadline(payload.get("deadline"), msg_id))
        if message.data_type == DataType.ENVELOPE:  # a bin envelope: its bytes are the request
            return Request(message.id, payload)
        raise _refuse(f"a request of data type {DataType(message.data_type).name} is not "
                      "supported", message.id)

    def _on_sleep_request(self, message: Message) -> Event:
        """A REQUEST on the data socket: sleep or wake (capability ``sleep`` only)."""
        if "sleep" not in self.features:
            raise _refuse("a REQUEST on the data socket needs the 'sleep' capability, which "
                          "was not negotiated", message.id)
        payload = message.payload
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "wake":
            return WakeRequest(message.id)
        if kind == "sleep":
            level = payload.get("level", 1)
            if type(level) is not int or level not in SLEEP_LEVELS:
                raise _refuse(f"sleep level must be one of {SLEEP_LEVELS}, got {_show(level)}",
                              message.id)
            return SleepRequest(message.id, level)
        raise _refuse(f"a data-socket REQUEST must be {{type: sleep | wake}}, got "
                      f"{_show(payload)}", message.id)

    def _on_server_error(self, message: Message) -> ServerError:
        payload = message.payload
        error = payload.get("error") if isinstance(payload, dict) else payload
        return ServerError(message.id, _text(str(error), "error", MAX_ERROR_TEXT))

    # -- output ----------------------------------------------------------------------------
    def send(self, event: Event) -> list[bytes | memoryview]:
        """The frame(s) for ``event``; empty when there is nothing to send (see Chunk)."""
        cls = type(event)
        if cls is Reply:  # the hot path first
            return encode(MessageType.DATA, DataType.DEFAULT, event.id, event.data)
        encoder = _WORKER_ENCODERS.get(cls)
        if encoder is None:
            raise LocalProtocolError(f"a worker does not send {cls.__name__}")
        return encoder(self, event)

    def _send_registration(self, event: Registration) -> list[bytes | memoryview]:
        return encode(MessageType.REGISTRATION, DataType.DEFAULT, event.id,
                      registration_payload(event.name, event.features))

    def _send_status(self, event: Status) -> list[bytes | memoryview]:
        payload: dict[str, Any] = {"event": int(EventType.STATUS), "status": event.status}
        if event.status == "failed":
            self._needs("init-failure", "a 'failed' status")
            payload["error"] = event.error or ""
        return encode(MessageType.EVENT, DataType.DEFAULT, event.id, payload)

    def _send_progress(self, event: Progress) -> list[bytes | memoryview]:
        self._needs("progress", "a progress event")
        return encode(MessageType.EVENT, DataType.DEFAULT, event.id,
                      {"event": int(EventType.NOTIFY), "request": event.request,
                       "fraction": event.fraction, "message": event.message})

    def _send_pong(self, event: Pong) -> list[bytes | memoryview]:
        return encode(MessageType.PONG, DataType.DEFAULT, event.id, {"event": 0})

    def _send_status_reply(self, event: StatusReply) -> list[bytes | memoryview]:
        return encode(MessageType.RESPONSE, DataType.DEFAULT, event.id, {"status": event.status})

    def _send_health_reply(self, event: HealthReply) -> list[bytes | memoryview]:
        return encode(MessageType.RESPONSE, DataType.DEFAULT, event.id, event.payload)

    def _send_envelope(self, event: EnvelopeReply) -> list[bytes | memoryview]:
        try:  # the rules a server applies (below): tell the author here, not the server
            _headers(event.headers, event.id)
            _status_code(event.status_code, event.id)
        except ProtocolError as exc:
            raise LocalProtocolError(f"Response {exc}") from None
        # verda-io's layout: a bin holding {payload, headers, status_code}.
        return encode(MessageType.DATA, DataType.ENVELOPE, event.id, Packed(
            {"payload": event.data, "headers": event.headers, "status_code": event.status_code}))

    def _send_chunk(self, event: Chunk) -> list[bytes | memoryview]:
        if "stream" in self.features:
            return encode(MessageType.DATA, DataType.STREAM, event.id, event.data)
        if not event.data:
            return []  # a plain verda-io server reads an empty chunk as the end of the stream
        return encode(MessageType.DATA, DataType.DEFAULT, event.id, event.data)

    def _send_end(self, event: EndOfStream) -> list[bytes | memoryview]:
        if "stream" in self.features:
            return encode(MessageType.DATA, DataType.STREAM, event.id, None)
        return encode(MessageType.DATA, DataType.DEFAULT, event.id, b"")

    def _send_sleep_reply(self, event: SleepReply | WakeReply) -> list[bytes | memoryview]:
        self._needs("sleep", f"a {type(event).__name__}")
        payload: dict[str, Any] = {"status": event.status}
        if event.error is not None:
            payload["error"] = event.error
        if isinstance(event, SleepReply):
            for key in ("kept_mib", "host_mib"):
                value = getattr(event, key)
                if value is not None:
                    payload[key] = _uint(value, key)
        return encode(MessageType.RESPONSE, DataType.DEFAULT, event.id, payload)

    def _send_error(self, event: ErrorReply) -> list[bytes | memoryview]:
        if "error-status" in self.features:
            payload: dict[str, Any] = {"error": event.error, "type": event.kind,
                                       "status_code": event.status_code}
        else:  # verda-io's own payload
            payload = {"error": event.error, "type": "prediction_error"}
        return encode(MessageType.ERROR, DataType.DEFAULT, event.id, payload)


_WORKER_ENCODERS: dict[type, Callable[[WorkerConversation, Any], list[bytes | memoryview]]] = {
    Registration: WorkerConversation._send_registration,
    Status: WorkerConversation._send_status,
    Progress: WorkerConversation._send_progress,
    Pong: WorkerConversation._send_pong,
    StatusReply: WorkerConversation._send_status_reply,
    HealthReply: WorkerConversation._send_health_reply,
    EnvelopeReply: WorkerConversation._send_envelope,
    Chunk: WorkerConversation._send_chunk,
    EndOfStream: WorkerConversation._send_end,
    ErrorReply: WorkerConversation._send_error,
    SleepReply: WorkerConversation._send_sleep_reply,
    WakeReply: WorkerConversation._send_sleep_reply,
}


# -- the server's end ---------------------------------------------------------------------------


class ServerConversation(_Conversation):
    """A server's end of one worker socket: registration first, then the worker's messages.

    ``name``, ``registration`` and ``features`` are set once the worker registered.  The
    server decides whether to accept that name; if it does, it sends :meth:`acknowledge`.
    """

    _peer = "worker"

    def __init__(self, channel: Channel, *, offered: frozenset[str] = EXTENSIONS,
                 max_frame_size: int | None = None) -> None:
        super().__init__(channel, max_frame_size)
        self.offered = offered
        self.registration: Registration | None = None
        self._open: dict[int, bool] = {}  # request wire id -> a plain stream is expected
        self._pings: dict[int, None] = {}  # unanswered, oldest first
        self._asked: dict[int, type] = {}  # control request id -> its reply type
        self._handlers = {MessageType.REGISTRATION: self._on_registration}

    @property
    def name(self) -> str | None:
        return self.registration.name if self.registration is not None else None

    @property
    def registered(self) -> bool:
        return self.registration is not None

    @property
    def open_requests(self) -> int:
        return len(self._open)

    @property
    def unanswered_pings(self) -> int:
        return len(self._pings)

    def track(self, wire_id: int, *, stream: bool = False) -> None:
        """Expect a reply to request ``wire_id``, sent by other means (raw, in tests)."""
        self._open[wire_id] = stream and "stream" not in self.features

    def acknowledge(self) -> list[bytes | memoryview]:
        """The ACKNOWLEDGEMENT of the registration, advertising the server's features."""
        reg = self.registration
        if reg is None:
            raise LocalProtocolError("nothing to acknowledge: the worker has not registered")
        payload: dict[str, Any] = {"identifier": reg.name}
        if self.offered:
            payload[ACK_FEATURES_KEY] = format_features(self.offered)
        return encode(MessageType.ACKNOWLEDGEMENT, DataType.DEFAULT, reg.id, payload)

    # -- input -----------------------------------------------------------------------------
    def interpret(self, message: Message) -> Event:
        if self.registration is None and message.type != MessageType.REGISTRATION:
            raise ProtocolError(
                f"the first frame must be a REGISTRATION, not {MessageType(message.type).name}",
                fatal=True)
        return super().interpret(message)

    def _on_refused(self, exc: ProtocolError) -> None:
        # A refused reply ends its request: the caller fails it, and nothing more of it counts.
        if exc.message_id is not None and self.channel is Channel.DATA:
            self._open.pop(exc.message_id, None)
            self._asked.pop(exc.message_id, None)
        super()._on_refused(exc)

    def _on_registration(self, message: Message) -> Registration:
        if self.registration is not None:
            raise _refuse("a second REGISTRATION on a registered connection")
        payload = message.payload
        name = _name(payload.get("identifier"), "the worker identifier", MAX_NAME)
        kind = payload.get("type", "ml_worker")
        kind = _name(kind, "the worker type", MAX_KIND)
        metadata = payload.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ProtocolError(f"registration metadata must be a map, got "
                                f"{_kind_of(metadata)}", fatal=True)
        raw_features = metadata.get(REGISTRATION_FEATURES_KEY)
        if not (raw_features is None
                or (isinstance(raw_features, str) and len(raw_features) <= 4096)
                or (isinstance(raw_features, list) and len(raw_features) <= 64
                    and all(isinstance(f, str) for f in raw_features))):
            raise ProtocolError(f"registration features must be a comma-separated str, got "
                                f"{_show(raw_features)}", fatal=True)
        theirs = parse_features(raw_features)
        version = metadata.get(REGISTRATION_VERSION_KEY)
        if version is not None:
            version = _name(version, "the protocol version", MAX_KIND)
        self.registration = reg = Registration(message.id, name, kind, theirs, version)
        self.features = theirs & self.offered
        # From now on, the worker's messages (the handlers of this socket):
        handlers: dict[int, Callable[[Message], Event]] = {
            MessageType.REGISTRATION: self._on_registration, MessageType.PONG: self._on_pong}
        if self.channel is Channel.CONTROL:
            handlers[MessageType.EVENT] = self._on_event
            handlers[MessageType.RESPONSE] = self._on_response
        else:
            handlers[MessageType.DATA] = self._on_data
            handlers[MessageType.ERROR] = self._on_error
            handlers[MessageType.RESPONSE] = self._on_response  # to a sleep or a wake
            if "data-progress" in self.features:  # progress, in order with the chunks
                handlers[MessageType.EVENT] = self._on_data_event
        self._handlers = handlers
        return reg

    def _on_pong(self, message: Message) -> Pong:
        pings = self._pings
        if message.id not in pings:
            raise _refuse(f"PONG {message.id} answers no ping")
        for ping_id in list(pings):  # pongs come in order: the older pings were answered too
            del pings[ping_id]
            if ping_id == message.id:
                break
        return Pong(message.id)

    def _on_event(self, message: Message) -> Event:
        payload = message.payload
        code = _event_code(payload, message.id)
        if code == EventType.STATUS:
            status = payload.get("status")
            if status == "failed" and "init-failure" in self.features:
                error = payload.get("error")
                return Status(message.id, "failed",
                              _text("" if error is None else error, "the init error",
                                    MAX_ERROR_TEXT),
                              message.timestamp)
            if status not in STATUSES:
                raise _refuse(f"unknown worker status {_show(status)}")
            return Status(message.id, status, None, message.timestamp)
        if code == EventType.NOTIFY and "progress" in self.features:
            msg = payload.get("message", "")
            return Progress(message.id, _uint(payload.get("request"), "progress request"),
                            _fraction(payload.get("fraction"), None),
                            _text("" if msg is None else msg, "progress text",
                                  MAX_PROGRESS_TEXT))
        raise _refuse(f"event code {code} ({EventType(code).name}) is not expected from a "
                      "worker")

    def _on_data_event(self, message: Message) -> Event:
        """On the data socket (``data-progress``): a progress event, and nothing else."""
        if _event_code(message.payload, message.id) != EventType.NOTIFY:
            raise _refuse("this event is not expected on the data socket (only progress "
                          "events are)")
        return self._on_event(message)

    def _on_response(self, message: Message) -> Event:
        kind = self._asked.pop(message.id, None)
        if kind is None:
            raise _refuse(f"RESPONSE {message.id} answers no request")
        payload = message.payload
        if kind is SleepReply or kind is WakeReply:
            return _sleep_reply(kind, message.id, payload)
        if kind is StatusReply:
            status = payload.get("status") if isinstance(payload, dict) else None
            if not isinstance(status, str) or len(status) > MAX_STATUS:
                raise _refuse(f"status reply must be {{status: str}}, got {_show(payload)}")
            return StatusReply(message.id, status)
        return HealthReply(message.id, payload if isinstance(payload, dict)
                           else {"status": "error", "error": f"health reply is "
                                 f"{_kind_of(payload)}, not a map"})

    def _on_data(self, message: Message) -> Event:
        msg_id = message.id
        plain_stream = self._open.get(msg_id)
        if plain_stream is None:
            raise _refuse(f"DATA for request {msg_id}, which is not open")
        payload = message.payload
        dtype = message.data_type
        if dtype == DataType.DEFAULT:  # (the decoder made sure the payload is bin)
            if not plain_stream:
                del self._open[msg_id]
                return Reply(msg_id, payload)
            if payload:
                return Chunk(msg_id, payload)
            del self._open[msg_id]
            return EndOfStream(msg_id)
        if dtype == DataType.STREAM and "stream" in self.features:
            if payload is None:
                del self._open[msg_id]
                return EndOfStream(msg_id)
            return Chunk(msg_id, payload)
        if dtype == DataType.ENVELOPE:
            if type(payload) is not bytes:
                raise _refuse(f"an envelope reply must be bin, got {_kind_of(payload)}", msg_id)
            env = _unpack_nested(payload, msg_id)
            if not isinstance(env, dict):
                raise _refuse(f"an envelope reply must hold a map, got {_kind_of(env)}", msg_id)
            data = env.get("payload", b"")
            if type(data) is not bytes:
                raise _refuse(f"the envelope's payload must be bin, got {_show(data)}", msg_id)
            headers = _headers(env.get("headers"), msg_id)
            code = _status_code(env.get("status_code", 200), msg_id)
            del self._open[msg_id]
            return EnvelopeReply(msg_id, data, headers, code)
        raise _refuse(f"a reply of data type {DataType(dtype).name} is not allowed here", msg_id)

    def _on_error(self, message: Message) -> Event:
        msg_id = message.id
        asked = self._asked.pop(msg_id, None) if self.channel is Channel.DATA else None
        if asked is not None:  # a worker refused our sleep or wake request
            payload = message.payload
            error = payload.get("error", "") if isinstance(payload, dict) else payload
            return asked(msg_id, "error", _text(str(error), "error", MAX_ERROR_TEXT))
        if msg_id not in self._open:
            raise _refuse(f"ERROR for request {msg_id}, which is not open")
        payload = message.payload
        if not isinstance(payload, dict):
            raise _refuse(f"an ERROR payload must be a map, got {_kind_of(payload)}", msg_id)
        error = payload.get("error", "")
        kind = payload.get("type", "prediction_error")
        if not isinstance(kind, str) or len(kind) > MAX_KIND:
            raise _refuse(f"error type must be a short str, got {_show(kind)}", msg_id)
        code = 500
        if "status_code" in payload and "error-status" in self.features:
            code = _status_code(payload["status_code"], msg_id)
        del self._open[msg_id]
        return ErrorReply(msg_id, _text(error, "error", MAX_ERROR_TEXT, msg_id), kind, code)

    # -- output ----------------------------------------------------------------------------
    def send(self, event: Event) -> list[bytes | memoryview]:
        """The frame(s) for ``event``; requests, pings and control requests are tracked."""
        encoder = _SERVER_ENCODERS.get(type(event))
        if encoder is None:
            raise LocalProtocolError(f"a server does not send {type(event).__name__}")
        if self.registration is None:
            raise LocalProtocolError("the worker has not registered on this connection yet")
        return encoder(self, event)

    def _send_request(self, event: Request) -> list[bytes | memoryview]:
        if self.channel is not Channel.DATA:
            raise LocalProtocolError("requests go on the data socket")
        if event.id in self._open:
            raise LocalProtocolError(f"request {event.id} is already open")
        if "envelope" in self.features:
            frames = encode(MessageType.DATA, DataType.ENVELOPE, event.id, {
                "request_id": event.request_id, "metadata": event.metadata or {},
                "deadline": event.deadline, "payload": event.payload})
        else:
            frames = encode(MessageType.DATA, DataType.DEFAULT, event.id, event.payload)
        self._open[event.id] = event.stream and "stream" not in self.features
        return frames

    def _send_ping(self, event: Ping) -> list[bytes | memoryview]:
        if len(self._pings) >= MAX_UNANSWERED:
            raise LocalProtocolError(f"{MAX_UNANSWERED} pings are unanswered already")
        self._pings[event.id] = None
        return encode(MessageType.PING, DataType.DEFAULT, event.id, {"event": 0})

    def _send_event(self, event: Event) -> list[bytes | memoryview]:
        if self.channel is not Channel.CONTROL:
            raise LocalProtocolError("events go on the control socket")
        if isinstance(event, Cancel):
            self._needs("cancel", "CANCEL")
            payload: dict[str, Any] = {"event": int(EventType.CANCEL), "request": event.request}
        elif isinstance(event, Shutdown):
            payload = {"event": int(EventType.SHUTDOWN)}
        else:
            payload = {"event": int(EventType.STATUS)}
        return encode(MessageType.EVENT, DataType.DEFAULT, event.id, payload)

    def _send_sleep(self, event: Event) -> list[bytes | memoryview]:
        if self.channel is not Channel.DATA:
            raise LocalProtocolError("sleep and wake go on the data socket")
        self._needs("sleep", type(event).__name__)
        if len(self._asked) >= MAX_UNANSWERED:
            raise LocalProtocolError(f"{MAX_UNANSWERED} sleep or wake requests are unanswered")
        if isinstance(event, SleepRequest):
            if event.level not in SLEEP_LEVELS:
                raise LocalProtocolError(f"sleep level must be one of {SLEEP_LEVELS}")
            self._asked[event.id] = SleepReply
            payload: dict[str, Any] = {"type": "sleep", "level": event.level}
        else:
            self._asked[event.id] = WakeReply
            payload = {"type": "wake"}
        return encode(MessageType.REQUEST, DataType.DEFAULT, event.id, payload)

    def _send_control_request(self, event: Event) -> list[bytes | memoryview]:
        if self.channel is not Channel.CONTROL:
            raise LocalProtocolError("control requests go on the control socket")
        if len(self._asked) >= MAX_UNANSWERED:
            raise LocalProtocolError(f"{MAX_UNANSWERED} control requests are unanswered")
        health = isinstance(event, HealthRequest)
        self._asked[event.id] = HealthReply if health else StatusReply
        return encode(MessageType.REQUEST, DataType.DEFAULT, event.id,
                      {"type": "hardware_health" if health else "status"})


_SERVER_ENCODERS: dict[type, Callable[[ServerConversation, Any], list[bytes | memoryview]]] = {
    Request: ServerConversation._send_request,
    Ping: ServerConversation._send_ping,
    Cancel: ServerConversation._send_event,
    Shutdown: ServerConversation._send_event,
    StatusQuery: ServerConversation._send_event,
    HealthRequest: ServerConversation._send_control_request,
    StatusRequest: ServerConversation._send_control_request,
    SleepRequest: ServerConversation._send_sleep,
    WakeRequest: ServerConversation._send_sleep,
}


_SLEEP_STATUS = {SleepReply: "asleep", WakeReply: "awake"}


def _sleep_reply(kind: type, msg_id: int, payload: object) -> Event:
    """A worker's RESPONSE to a sleep (``kind`` SleepReply) or a wake (WakeReply), checked."""
    if not isinstance(payload, dict):
        raise _refuse(f"a sleep or wake reply must be a map, got {_kind_of(payload)}", msg_id)
    status = payload.get("status")
    if status == "error":
        error = payload.get("error", "")
        return kind(msg_id, "error", _text("" if error is None else str(error), "error",
                                           MAX_ERROR_TEXT))
    if status != _SLEEP_STATUS[kind]:
        raise _refuse(f"a {kind.__name__} must say {_SLEEP_STATUS[kind]!r} or 'error', got "
                      f"{_show(status)}", msg_id)
    if kind is WakeReply:
        return WakeReply(msg_id, status)
    kept, host = payload.get("kept_mib"), payload.get("host_mib")
    return SleepReply(msg_id, status, None,
                      None if kept is None else _uint(kept, "kept_mib", msg_id),
                      None if host is None else _uint(host, "host_mib", msg_id))
