"""A small blocking server built on the codec, for testing workers without an engine.

``WireServer`` listens on a control and a data socket, acknowledges registrations (advertising
our extensions, or none to behave like a plain verda-io server) and gives one
:class:`WorkerLink` per worker: send requests and read replies, cancel, ping, ask health or
status, shut down, and watch the worker's control events.  Model authors can use it to test a
worker script; vramtui's own tests and ``bench/protocol.py`` use it against real processes.
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

import msgpack

from .connection import Connection, ConnectionLost
from .protocol import (
    ACK_FEATURES_KEY,
    EXTENSIONS,
    DataType,
    EventType,
    Message,
    MessageType,
    ProtocolError,
    features_from_registration,
    format_features,
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
        self.events: queue.Queue[Message] = queue.Queue()
        self.statuses: list[str] = []
        self._responses: dict[int, queue.Queue[Message]] = defaultdict(queue.Queue)
        self._pending: dict[int, list[Message]] = defaultdict(list)
        self._read_lock = threading.Lock()
        self._poller: select.poll | None = None  # polls self.data; made on the first read
        self._polled: Connection | None = None
        self._ids = 0
        self._ids_lock = threading.Lock()
        self.ready = threading.Event()
        self.closed = threading.Event()

    def _next_id(self) -> int:
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
    ) -> int:
        """Send one request without waiting; returns its wire id."""
        assert self.data is not None
        wire_id = self._next_id()
        use_envelope = ("envelope" in self.features) if envelope is None else envelope
        if use_envelope:
            body = {
                "request_id": request_id if request_id is not None else str(wire_id),
                "metadata": metadata or {},
                "deadline": deadline,
                "payload": payload,
            }
            self.data.send(MessageType.DATA, DataType.ENVELOPE, wire_id, body)
        else:
            self.data.send(MessageType.DATA, DataType.DEFAULT, wire_id, payload)
        return wire_id

    def send_raw(self, frame: bytes) -> None:
        """Write raw bytes to the data socket (for hostile-input tests)."""
        assert self.data is not None
        self.data.sock.sendall(frame)

    def read(self, wire_id: int, timeout: float = 10.0) -> Message:
        """The next data-socket message for ``wire_id`` (one frame; raw, not collected)."""
        return self._read_for(wire_id, time.monotonic() + timeout)

    def _read_for(self, wire_id: int, deadline: float) -> Message:
        """The next data message for ``wire_id``, reading the data socket in this thread."""
        conn = self.data
        assert conn is not None
        with self._read_lock:
            stash = self._pending.get(wire_id)
            if stash:
                return stash.pop(0)
            decoder = conn.decoder
            poller = self._poller
            if poller is None or self._polled is not conn:
                poller = self._poller = select.poll()
                poller.register(conn.sock.fileno(), select.POLLIN)
                self._polled = conn
            while True:
                message = decoder.next()
                if message is None:
                    # Wait for more bytes (also when part of a frame is already buffered).
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not poller.poll(remaining * 1000):
                        raise TimeoutError(f"no reply from {self.name} for request {wire_id}")
                    with decoder.get_buffer() as view:
                        try:
                            n = conn.sock.recv_into(view)
                        except OSError as exc:
                            raise ConnectionLost(str(exc)) from exc
                    if n == 0:
                        raise ConnectionLost(f"{self.name} closed the data socket")
                    decoder.buffer_updated(n)
                elif message.id == wire_id:
                    return message
                else:
                    self._pending[message.id].append(message)

    def collect(self, wire_id: int, *, stream: bool = False, timeout: float = 10.0) -> Reply:
        """Read the whole reply to ``wire_id``; ``stream`` tells a plain worker's stream apart."""
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        while True:
            message = self._read_for(wire_id, deadline)
            if message.type == MessageType.ERROR:
                payload = message.payload
                err = payload if isinstance(payload, dict) else {"error": str(payload)}
                return Reply("error", chunks=chunks, error=err,
                             status_code=int(err.get("status_code", 500)))
            if message.type != MessageType.DATA:
                continue
            if message.data_type == DataType.STREAM:
                if message.payload is None:
                    return Reply("stream", data=b"".join(chunks), chunks=chunks)
                chunks.append(message.payload)
            elif message.data_type == DataType.ENVELOPE:
                env = msgpack.unpackb(message.payload, raw=False)
                return Reply(
                    "envelope",
                    data=env.get("payload", b""),
                    headers=env.get("headers") or {},
                    status_code=int(env.get("status_code", 200)),
                )
            elif stream:
                if message.payload == b"":
                    return Reply("stream", data=b"".join(chunks), chunks=chunks)
                chunks.append(message.payload)
            else:
                return Reply("bytes", data=message.payload)

    def request(self, payload: bytes, *, stream: bool = False, timeout: float = 10.0,
                **kw: Any) -> Reply:
        return self.collect(self.send_request(payload, **kw), stream=stream, timeout=timeout)

    # -- control ------------------------------------------------------------------------------
    def _control_call(self, msg_type: int, payload: Any, timeout: float) -> Message:
        assert self.control is not None
        msg_id = self._next_id()
        box = self._responses[msg_id]
        self.control.send(msg_type, DataType.DEFAULT, msg_id, payload)
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} did not answer control message {msg_id}") from None
        finally:
            self._responses.pop(msg_id, None)

    def ping(self, timeout: float = 5.0) -> Message:
        return self._control_call(MessageType.PING, {"event": 0}, timeout)

    def ping_data(self, timeout: float = 5.0) -> Message:
        assert self.data is not None
        wire_id = self._next_id()
        self.data.send(MessageType.PING, DataType.DEFAULT, wire_id, {"event": 0})
        return self._read_for(wire_id, time.monotonic() + timeout)

    def health(self, timeout: float = 5.0) -> Any:
        return self._control_call(MessageType.REQUEST, {"type": "hardware_health"}, timeout).payload

    def status(self, timeout: float = 5.0) -> Any:
        return self._control_call(MessageType.REQUEST, {"type": "status"}, timeout).payload

    def cancel(self, wire_id: int) -> None:
        assert self.control is not None
        self.control.send(MessageType.EVENT, DataType.DEFAULT, None,
                          {"event": int(EventType.CANCEL), "request": wire_id})

    def shutdown(self) -> None:
        assert self.control is not None
        self.control.send(MessageType.EVENT, DataType.DEFAULT, None,
                          {"event": int(EventType.SHUTDOWN)})

    def wait_event(self, predicate: Callable[[Message], bool], timeout: float = 10.0) -> Message:
        """The next control event matching ``predicate`` (others are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.name}: no matching control event")
            try:
                message = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if predicate(message):
                return message

    def wait_status(self, status: str, timeout: float = 10.0) -> Message:
        return self.wait_event(
            lambda m: isinstance(m.payload, dict) and m.payload.get("status") == status, timeout
        )

    def _on_control(self, message: Message) -> None:
        if message.type in (MessageType.RESPONSE, MessageType.PONG):
            box = self._responses.get(message.id)
            if box is not None:
                box.put(message)
                return
        if message.type == MessageType.EVENT and isinstance(message.payload, dict):
            status = message.payload.get("status")
            if message.payload.get("event") == EventType.STATUS and isinstance(status, str):
                self.statuses.append(status)
                if status == "ready":
                    self.ready.set()
        self.events.put(message)


class WireServer:
    """Listen on ``directory/ctrl.sock`` and ``directory/data.sock`` for workers."""

    def __init__(self, directory: str | os.PathLike[str], *,
                 features: frozenset[str] = EXTENSIONS, send_ack: bool = True) -> None:
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
            conn = Connection(sock)
            with self._links_changed:
                self._conns.append(conn)
            self._spawn(self._register, conn, is_control)

    def _register(self, conn: Connection, is_control: bool) -> None:
        try:
            first = conn.receive()
        except (ConnectionLost, ProtocolError):
            conn.close()
            return
        if first.type != MessageType.REGISTRATION or not isinstance(first.payload, dict):
            conn.close()
            return
        name = str(first.payload.get("identifier"))
        worker_features = features_from_registration(first.payload)
        if self.send_ack:
            ack: dict[str, Any] = {"identifier": name}
            if self.features:
                ack[ACK_FEATURES_KEY] = format_features(self.features)
            # The worker may already be gone (an init failure); still record what it sent.
            with contextlib.suppress(ConnectionLost):
                conn.send(MessageType.ACKNOWLEDGEMENT, DataType.DEFAULT, first.id, ack)
        with self._links_changed:
            link = self.links.get(name)
            # A second registration for a socket the link already has is a new session (the
            # worker reconnected, maybe before the old connection's EOF was seen): start a new
            # link.  A link that is already closed still takes its missing socket: the data
            # registration may be read after a short-lived worker's control EOF.
            taken = link is not None and (link.control if is_control else link.data) is not None
            if link is None or taken:
                link = WorkerLink(name, worker_features, self.features)
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
                message = conn.receive()
            except (ConnectionLost, ProtocolError):
                break
            link._on_control(message)
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
