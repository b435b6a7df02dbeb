"""A blocking Unix-socket connection that speaks the codec: the worker side's only I/O.

Sends are scatter/gather (``sendmsg``) under a lock, so large payloads leave uncopied and two
threads never interleave frames; receives go straight into the decoder's buffer.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from typing import Any

from .protocol import DEFAULT_MAX_FRAME, Decoder, Message, encode

_SOCK_BUF = 4 * 1024 * 1024


class ConnectionLost(Exception):
    """The peer went away (EOF, reset, or broken pipe)."""


def send_buffers(sock: socket.socket, buffers: list[bytes | memoryview]) -> None:
    """Send every byte of ``buffers``, resuming after partial sends."""
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


class Connection:
    """One connected socket: ``send`` from any thread, ``receive`` from one."""

    def __init__(self, sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.sock = sock
        self.decoder = Decoder(max_frame_size)
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)  # next() is atomic: send() may run on two threads
        self.closed = False

    @classmethod
    def connect(cls, path: str, timeout: float | None = None) -> Connection:
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
        return cls(sock)

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, msg_type: int, data_type: int, msg_id: int | None, payload: Any) -> int:
        """Send one frame; ``msg_id`` None takes this connection's next counter value."""
        if msg_id is None:
            msg_id = self.next_id()
        buffers = encode(msg_type, data_type, msg_id, payload)
        try:
            with self._send_lock:
                send_buffers(self.sock, buffers)
        except OSError as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc
        return msg_id

    def receive(self) -> Message:
        """Block until the next message; raises ConnectionLost or ProtocolError."""
        decoder = self.decoder
        while True:
            message = decoder.next()
            if message is not None:
                return message
            with decoder.get_buffer() as view:
                try:
                    n = self.sock.recv_into(view)
                except OSError as exc:
                    self.closed = True
                    raise ConnectionLost(str(exc)) from exc
            if n == 0:
                self.closed = True
                raise ConnectionLost("connection closed by peer")
            decoder.buffer_updated(n)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
