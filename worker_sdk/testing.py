"""A small blocking server built on the conversation layer, for testing workers without an engine.

``WireServer`` listens on a control and a data socket, acknowledges registrations (advertising
our extensions, or none to behave like a plain verda-io server) and gives one
:class:`WorkerLink` per worker: send requests and read replies, cancel, ping, ask health or
status, shut down, and watch the worker's control events.  Model authors can use it to test a
worker script; vramtui's own tests and ``bench/protocol.py`` use it against real processes.

It speaks through :class:`worker_sdk.conversation.ServerConversation`, like the engine: what
a worker sends is validated the same way, and a reply the conversation refuses makes
:meth:`WorkerLink.collect` raise :class:`~worker_sdk.protocol.ProtocolError`.
:meth:`WorkerLink.read` still returns each frame raw, for tests about the wire itself.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .connection import Connection, ConnectionLost, send_buffers
from .conversation import Channel, ServerConversation
from .events import (
    Cancel,
    Chunk,
    EndOfStream,
    EnvelopeReply,
    ErrorReply,
    Event,
    HealthReply,
    HealthRequest,
    Ping,
    Pong,
    Progress,
    Registration,
    Request,
    Shutdown,
    SleepReply,
    SleepRequest,
    Status,
    StatusReply,
    StatusRequest,
    WakeReply,
    WakeRequest,
)
from .events import Reply as WholeReply
from .protocol import (
    EXTENSIONS,
    DataType,
    Decoder,
    Message,
    MessageType,
    ProtocolError,
    encode_bytes,
)


@dataclass
class Reply:
    """A worker's answer to one request."""

    kind: str  # "bytes", "envelope", "stream" or "error"
    data: bytes = b""
    headers: dict[str, Any] = field(default_factory=dict)
    status_code: int = 200
    chunks: list[bytes] = field(default_factory=list)
    error: dict[str, Any] | None = None


class WorkerLink:
    """The server's side of one registered worker (a control and a data connection)."""

    def __init__(self, name: str, worker_features: frozenset[str], offered: frozenset[str]):
        self.name = name
        self.worker_features = worker_features
        self.features = worker_features & offered
        self.control: Connection | None = None
        self.data: Connection | None = None
        self.events: queue.Queue[Event] = queue.Queue()  # the worker's control events, typed
        self.statuses: list[str] = []
        self._responses: dict[int, queue.Queue[tuple[Event, Message | None]]] = \
            defaultdict(queue.Queue)
        # Data frames read for another request than the one being waited for.
        self._pending: dict[int, list[tuple[Message | None, Event | ProtocolError]]] = \
            defaultdict(list)
        self._read_lock = threading.Lock()
        self._poller: select.poll | None = None  # polls self.data; made on the first read
        self._polled: Connection | None = None
        self._ids = 0
        self._ids_lock = threading.Lock()
        self.refused: list[ProtocolError] = []  # control frames the conversation refused
        self.ready = threading.Event()
        self.closed = threading.Event()

    def _next_id(self) -> int:
        """One counter for both sockets (ids need only be unique per connection; this is
        simpler to read in a test)."""
        with self._ids_lock:
            self._ids += 1
            return self._ids

    # -- requests ---------------------------------------------------------------------------
    def send_request(
        self,
        payload: bytes,
        *,
        request_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
        envelope: bool | None = None,
        stream: bool = False,
    ) -> int:
        """Send one request without waiting; returns its wire id.

        ``stream`` says a plain worker's reply will be a stream; ``envelope=False`` sends a
        plain DATA frame even to a worker that takes envelopes.
        """
        data = self.data
        assert data is not None
        wire_id = self._next_id()
        if envelope is False and "envelope" in self.features:
            data.conversation.track(wire_id, stream=stream)
            data.send_raw(encode_bytes(MessageType.DATA, DataType.DEFAULT, wire_id, payload))
            return wire_id
        data.send(Request(wire_id, payload,
                          request_id if request_id is not None else str(wire_id),
                          metadata, deadline, stream))
        return wire_id

    def send_raw(self, frame: bytes) -> None:
        """Write raw bytes to the data socket (for hostile-input tests).

        A DATA frame's reply is expected, whatever else is wrong with the frame.
        """
        assert self.data is not None
        probe = Decoder()
        probe.feed(frame)
        try:
            message = probe.next()
            wire_id = message.id if message is not None and message.type == MessageType.DATA \
                else None
        except ProtocolError as exc:
            wire_id = exc.message_id
        if wire_id is not None:
            self.data.conversation.track(wire_id)
        self.data.send_raw(frame)

    def read(self, wire_id: int, timeout: float = 10.0) -> Message:
        """The next data-socket frame for ``wire_id`` (raw, as the worker sent it)."""
        message, _event = self._read_for(wire_id, time.monotonic() + timeout)
        assert message is not None
        return message

    def _read_for(self, wire_id: int, deadline: float,
                  ) -> tuple[Message | None, Event | ProtocolError]:
        """The next data frame for ``wire_id`` and what it means, reading in this thread."""
        conn = self.data
        assert conn is not None
        with self._read_lock:
            stash = self._pending.get(wire_id)
            if stash:
                return stash.pop(0)
            conv = conn.conversation
            poller = self._poller
            if poller is None or self._polled is not conn:
                poller = self._poller = select.poll()
                poller.register(conn.sock.fileno(), select.POLLIN)
                self._polled = conn
            while True:
                try:
                    event: Event | ProtocolError | None = conv.next_event()
                except ProtocolError as exc:
                    if exc.fatal:
                        raise
                    event = exc
                if event is None:
                    # Wait for more bytes (also when part of a frame is already buffered).
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not poller.poll(remaining * 1000):
                        raise TimeoutError(f"no reply from {self.name} for request {wire_id}")
                    try:
                        conn.fill()
                    except ConnectionLost as exc:
                        raise ConnectionLost(f"{self.name} closed the data socket: {exc}") \
                            from None
                    continue
                if type(event) is Progress:
                    self.events.put(event)
                    continue
                frame_id = event.message_id if isinstance(event, ProtocolError) else event.id
                found = (conv.last_message, event)
                if frame_id == wire_id:
                    return found
                if frame_id is not None:
                    self._pending[frame_id].append(found)

    def collect(self, wire_id: int, *, timeout: float = 10.0, stream: bool = False) -> Reply:
        """Read the whole reply to ``wire_id``; a malformed one raises ProtocolError.

        (``stream`` is accepted for older callers; say it to :meth:`send_request` instead.)
        """
        del stream
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        while True:
            _message, event = self._read_for(wire_id, deadline)
            if isinstance(event, ProtocolError):
                raise event
            cls = type(event)
            if cls is WholeReply:
                return Reply("bytes", data=bytes(event.data))  # type: ignore[attr-defined]
            if cls is Chunk:
                chunks.append(bytes(event.data))  # type: ignore[attr-defined]
            elif cls is EndOfStream:
                return Reply("stream", data=b"".join(chunks), chunks=chunks)
            elif cls is EnvelopeReply:
                assert isinstance(event, EnvelopeReply)
                return Reply("envelope", data=bytes(event.data), headers=event.headers,
                              status_code=event.status_code)
            elif cls is ErrorReply:
                assert isinstance(event, ErrorReply)
                message = _message
                raw = message.payload if message is not None else None
                return Reply("error", chunks=chunks, status_code=event.status_code,
                              error=raw if isinstance(raw, dict) else
                              {"error": event.error, "type": event.kind})

    def request(self, payload: bytes, *, stream: bool = False, timeout: float = 10.0,
                **kw: Any) -> Reply:
        return self.collect(self.send_request(payload, stream=stream, **kw), timeout=timeout)

    # -- control ------------------------------------------------------------------------------
    def _control_call(self, event: Event, timeout: float) -> tuple[Event, Message | None]:
        assert self.control is not None
        box = self._responses[event.id]
        self.control.send(event)
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} did not answer control message {event.id}") \
                from None
        finally:
            self._responses.pop(event.id, None)

    def ping(self, timeout: float = 5.0) -> Message:
        """PING on the control socket; the PONG frame as the worker sent it."""
        assert self.control is not None
        _pong, message = self._control_call(Ping(self._next_id()), timeout)
        assert message is not None
        return message

    def ping_data(self, timeout: float = 5.0) -> Message:
        """PING on the data socket; the PONG frame as the worker sent it."""
        assert self.data is not None
        wire_id = self._next_id()
        self.data.send(Ping(wire_id))
        message, event = self._read_for(wire_id, time.monotonic() + timeout)
        if isinstance(event, ProtocolError):
            raise event
        assert message is not None
        return message

    def health(self, timeout: float = 5.0) -> Any:
        assert self.control is not None
        reply, _ = self._control_call(HealthRequest(self._next_id()), timeout)
        return reply.payload  # type: ignore[attr-defined]

    def status(self, timeout: float = 5.0) -> dict[str, str]:
        assert self.control is not None
        reply, _ = self._control_call(StatusRequest(self._next_id()), timeout)
        return {"status": reply.status}  # type: ignore[attr-defined]

    def cancel(self, wire_id: int) -> None:
        """Cancel a request (silently nothing when the worker did not negotiate ``cancel``)."""
        assert self.control is not None
        if "cancel" in self.control.conversation.features:
            self.control.send(Cancel(self._next_id(), wire_id))

    def sleep(self, level: int = 1, timeout: float = 10.0) -> SleepReply:
        """Ask the worker to sleep (needs the ``sleep`` capability, offered by the server:
        ``WireServer(features=KNOWN_FEATURES)``); its reply."""
        reply = self._sleep_call(SleepRequest(self._next_id(), level), timeout)
        assert isinstance(reply, SleepReply)
        return reply

    def wake(self, timeout: float = 10.0) -> WakeReply:
        """Ask a sleeping worker to wake; its reply."""
        reply = self._sleep_call(WakeRequest(self._next_id()), timeout)
        assert isinstance(reply, WakeReply)
        return reply

    def _sleep_call(self, event: Event, timeout: float) -> Event:
        assert self.data is not None
        self.data.send(event)
        _message, reply = self._read_for(event.id, time.monotonic() + timeout)
        if isinstance(reply, ProtocolError):
            raise reply
        return reply

    def shutdown(self) -> None:
        assert self.control is not None
        self.control.send(Shutdown(self._next_id()))

    def wait_event(self, predicate: Callable[[Event], bool], timeout: float = 10.0) -> Event:
        """The next control event matching ``predicate`` (others are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: no matching control event")
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if predicate(event):
                return event

    def wait_status(self, status: str, timeout: float = 10.0) -> Event:
        return self.wait_event(lambda e: isinstance(e, Status) and e.status == status, timeout)

    def on_control(self, event: Event, message: Message | None) -> None:
        if isinstance(event, Pong | StatusReply | HealthReply):
            box = self._responses.get(event.id)
            if box is not None:
                box.put((event, message))
            return
        if isinstance(event, Status):
            self.statuses.append(event.status)
            if event.status == "ready":
                self.ready.set()
        self.events.put(event)


class WireServer:
    """Listen on ``directory/ctrl.sock`` and ``directory/data.sock`` for workers.

    By default progress stays on the control socket (``events``), where a test waits for it
    while a request runs; offered ``data-progress``, it comes in order with the data frames
    and is put on ``events`` as the data socket is read."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 features: frozenset[str] = EXTENSIONS - {"data-progress"},
                 send_ack: bool = True) -> None:
        self.control_path = os.path.join(os.fspath(directory), "ctrl.sock")
        self.data_path = os.path.join(os.fspath(directory), "data.sock")
        self.features = features
        self.send_ack = send_ack
        self.links: dict[str, WorkerLink] = {}
        self._links_changed = threading.Condition()
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._conns: list[Connection] = []
        self._closing = False

    def start(self) -> WireServer:
        for path in (self.control_path, self.data_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(16)
            self._listeners.append(listener)
            self._spawn(self._accept_loop, listener, path == self.control_path)
        return self

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._closing = True
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in list(self._conns):
            conn.close()
        for path in (self.control_path, self.data_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._listeners.clear()

    def drop_connections(self) -> None:
        """Close every worker connection but keep listening (to test reconnects)."""
        # Detach under the lock first: a worker may reconnect while the old sockets close,
        # and its new connections and link must survive.
        with self._links_changed:
            conns, self._conns = self._conns, []
            links = list(self.links.values())
            self.links.clear()
        for conn in conns:
            conn.close()
        for link in links:
            link.closed.set()

    def _accept_loop(self, listener: socket.socket, is_control: bool) -> None:
        while not self._closing:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            conv = ServerConversation(Channel.CONTROL if is_control else Channel.DATA,
                                      offered=self.features)
            conn = Connection(sock, conv)
            with self._links_changed:
                self._conns.append(conn)
            self._spawn(self._register, conn, is_control)

    def _register(self, conn: Connection, is_control: bool) -> None:
        try:
            registration = conn.receive()
        except (ConnectionLost, ProtocolError):
            conn.close()
            return
        assert isinstance(registration, Registration)  # the conversation allows nothing else
        name = registration.name
        if self.send_ack:
            # The worker may already be gone (an init failure); still record what it sent.
            with contextlib.suppress(OSError):
                send_buffers(conn.sock, conn.conversation.acknowledge())
        with self._links_changed:
            link = self.links.get(name)
            # A second registration for a socket the link already has is a new session (the
            # worker reconnected, maybe before the old connection's EOF was seen): start a new
            # link.  A link that is already closed still takes its missing socket: the data
            # registration may be read after a short-lived worker's control EOF.
            taken = link is not None and (link.control if is_control else link.data) is not None
            if link is None or taken:
                link = WorkerLink(name, registration.features, self.features)
                self.links[name] = link
            if is_control:
                link.control = conn
            else:
                link.data = conn
            self._links_changed.notify_all()
        if is_control:
            self._control_reader(link, conn)

    def _control_reader(self, link: WorkerLink, conn: Connection) -> None:
        while True:
            try:
                event = conn.receive()
            except ConnectionLost:
                break
            except ProtocolError as exc:
                link.refused.append(exc)
                if exc.fatal:
                    break
                continue
            link.on_control(event, conn.conversation.last_message)
        link.closed.set()

    def wait_worker(self, name: str | None = None, timeout: float = 15.0,
                    ready: bool = True) -> WorkerLink:
        """The link of worker ``name`` (any, if None) once both sockets registered.

        With ``ready`` (the default) only a live link counts, and it must reach status
        ``ready``; with ``ready=False`` a link whose worker already went away is returned too,
        so its control events can be inspected.
        """
        deadline = time.monotonic() + timeout

        def found() -> WorkerLink | None:
            for link in self.links.values():
                if (
                    (name is None or link.name == name)
                    and link.control
                    and link.data
                    and not (ready and link.closed.is_set())
                ):
                    return link
            return None

        with self._links_changed:
            while (link := found()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"worker {name or ''} did not register in {timeout} s")
                self._links_changed.wait(remaining)
        if ready and not link.ready.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"worker {link.name} did not become ready in {timeout} s")
        return link
