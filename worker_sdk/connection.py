"""A blocking Unix-socket connection that carries one conversation: the worker side's only I/O.

Sends are scatter/gather (``sendmsg``) under a lock, so large payloads leave uncopied and two
threads never interleave frames; receives go straight into the conversation's buffer.  What the
frames mean is the conversation's business (:mod:`worker_sdk.conversation`); this module only
moves bytes.

Whom a worker talks to: the sockets may be in a shared place (verda-io's defaults are
``/tmp/verda-io.*.sock``), where another user could listen first and would then send the
worker its own requests (run on our model and GPU) and read the answers.  So once connected,
before a byte is sent, the server's uid (``SO_PEERCRED``: who listened) must be ours, root's, or
the user ``VRAMTUI_ENGINE_USER`` names (:func:`check_server`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import struct
import threading
from collections.abc import Mapping

from .conversation import ServerConversation, WorkerConversation
from .events import Event

_SOCK_BUF = 4 * 1024 * 1024

Conversation = WorkerConversation | ServerConversation


TRUST_VARIABLE = "VRAMTUI_ENGINE_USER"  # as the engine's clients: one more trusted user
_UCRED = struct.Struct("3i")


class ConnectionLost(Exception):
    """The peer went away (EOF, reset, or broken pipe)."""


class UntrustedServer(Exception):
    """The server at a socket is another user's; nothing was sent.  One line."""


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


class UnknownTrustedUser(ValueError):
    """``VRAMTUI_ENGINE_USER`` names no user here; the message is one line."""


def trusted_user_uids(environ: Mapping[str, str] = os.environ) -> frozenset[int]:
    """Our own uid, root, and the user ``VRAMTUI_ENGINE_USER`` names (a name or a uid):
    whom a worker's server and a client's engine may be (the engine's client reads it too);
    :class:`UnknownTrustedUser` when it names nobody."""
    uids = {os.geteuid(), 0}
    value = environ.get(TRUST_VARIABLE, "").strip()
    if value:
        if value.isascii() and value.isdigit():  # (not ², which int() refuses)
            uids.add(int(value))
        else:
            try:
                uids.add(pwd.getpwnam(value).pw_uid)
            except KeyError:
                raise UnknownTrustedUser(f"{TRUST_VARIABLE}={value}: no such user on this "
                                         "machine") from None
    return frozenset(uids)


def trusted_uids(environ: Mapping[str, str] = os.environ) -> frozenset[int]:
    """:func:`trusted_user_uids`, as the worker says it (:class:`UntrustedServer`)."""
    try:
        return trusted_user_uids(environ)
    except UnknownTrustedUser as exc:
        raise UntrustedServer(str(exc)) from None


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (``SO_PEERCRED``: as
    it was when it listened or connected); the one reader of it, the engine's too."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


def check_server(sock: socket.socket, path: str, trusted: frozenset[int]) -> None:
    """Refuse a connected socket whose server is not a trusted user (before any send);
    where the platform cannot tell (no ``SO_PEERCRED``), nothing is refused."""
    if not hasattr(socket, "SO_PEERCRED"):
        return
    try:
        pid, uid, _gid = peer_credentials(sock)
    except OSError as exc:
        raise UntrustedServer(f"cannot tell who serves {path} ({exc.strerror or exc}); "
                              "nothing was sent") from None
    if uid not in trusted:
        raise UntrustedServer(
            f"refusing the server at {path}: it is pid {pid} of {_user(uid)}, neither you "
            f"nor root; nothing was sent (if that user serves you on purpose, set "
            f"{TRUST_VARIABLE}={uid}; else use sockets in a private directory)")


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


def connect_unix(path: str, timeout: float | None = None,
                 trusted: frozenset[int] | None = None) -> socket.socket:
    """Connect to ``path``; with ``trusted``, refuse a server of any other uid
    (:class:`UntrustedServer`, the socket closed) before the caller sends anything."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCK_BUF)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUF)
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)
        if trusted is not None:
            check_server(sock, path, trusted)
    except BaseException:
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
