"""A blocking Unix-socket connection that carries one conversation: the worker side's only I/O.

Sends are scatter/gather (``sendmsg``) under a lock, so large payloads leave uncopied and two
threads never interleave frames; receives go straight into the conversation's buffer.  What the
frames mean is the conversation's business (:mod:`worker_sdk.conversation`); this module only
moves bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from .conversation import ServerConversation, WorkerConversation
from .events import Event

_SOCK_BUF = 4 * 1024 * 1024

Conversation = WorkerConversation | ServerConversation


class ConnectionLost(Exception):
    """The peer went away (EOF, reset, or broken pipe)."""


def send_buffers(sock: socket.socket, buffers: list[bytes | memoryview]) -> None:
    """Send every byte of ``buffers``, resuming after partial sends."""
    if len(buffers) == 1:
        sock.sendall(buffers[0])
        return
    total = sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in buffers)
    sent = sock.sendmsg(buffers)
    if sent == total:
        return
    views = [memoryview(b).cast("B") for b in buffers]
    while sent < total:
        while sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        views[0] = views[0][sent:]
        total = sum(v.nbytes for v in views)
        sent = sock.sendmsg(views)


def connect_unix(path: str, timeout: float | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCK_BUF)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUF)
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)
    except OSError:
        sock.close()
        raise
    return sock


class Connection:
    """One connected socket and its conversation: ``send`` from any thread, ``receive`` from one."""

    def __init__(self, sock: socket.socket, conversation: Conversation, *,
                 one_sender: bool = False) -> None:
        """``one_sender``: only one thread ever sends here, so sends take no lock."""
        self.sock = sock
        self.conversation = conversation
        self._send_lock: threading.Lock | contextlib.nullcontext[None] = \
            contextlib.nullcontext() if one_sender else threading.Lock()
        self.closed = False

    def send(self, event: Event) -> None:
        """Send ``event`` (nothing when the conversation says it has no frame)."""
        buffers = self.conversation.send(event)
        try:
            if len(buffers) == 1:  # the usual case
                with self._send_lock:
                    self.sock.sendall(buffers[0])
            elif buffers:
                with self._send_lock:
                    send_buffers(self.sock, buffers)
        except OSError as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc

    def send_raw(self, data: bytes) -> None:
        """Write raw bytes (for tests that speak what the conversation never would)."""
        try:
            with self._send_lock:
                self.sock.sendall(data)
        except OSError as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc

    def next_id(self) -> int:
        return self.conversation.next_id()

    def receive(self) -> Event:
        """Block until the next event; raises ConnectionLost or ProtocolError."""
        conv = self.conversation
        while True:
            event = conv.next_event()
            if event is not None:
                return event
            self.fill()

    def fill(self) -> None:
        """Block until some bytes arrive, into the conversation; ConnectionLost on EOF."""
        conv = self.conversation
        with conv.get_buffer() as view:
            try:
                n = self.sock.recv_into(view)
            except OSError as exc:
                self.closed = True
                raise ConnectionLost(str(exc)) from exc
        if n == 0:
            self.closed = True
            raise ConnectionLost("connection closed by peer")
        conv.buffer_updated(n)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
