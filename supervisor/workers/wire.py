"""The engine's end of the worker sockets: asyncio protocols on the shared codec.

:class:`WireListener` listens on the control and the data socket (in the 0700 runtime
directory), reads each connection's REGISTRATION and hands the connection to whoever claimed
that worker name — only workers the engine itself started are accepted, and the connecting
process must be that worker or one of its descendants (checked with SO_PEERCRED).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol

from worker_sdk.protocol import (
    ACK_FEATURES_KEY,
    EXTENSIONS,
    DataType,
    Decoder,
    Message,
    MessageType,
    ProtocolError,
    encode,
    features_from_registration,
    format_features,
)

log = logging.getLogger(__name__)
_UCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


class WireConnection(asyncio.BufferedProtocol):
    """One accepted connection: decodes into messages, encodes and writes replies."""

    def __init__(self, on_registration: Callable[[WireConnection, Message], None]) -> None:
        self.decoder = Decoder()
        self.transport: asyncio.Transport | None = None
        self.peer_pid: int | None = None
        self.peer_uid: int | None = None
        self.name: str | None = None
        self.features: frozenset[str] = frozenset()
        self._on_registration = on_registration
        self.on_message: Callable[[Message], None] | None = None
        self.on_lost: Callable[[str], None] | None = None
        self.closed = False
        self._ids = 0

    # -- asyncio.BufferedProtocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                self.peer_pid, self.peer_uid, _gid = peer_credentials(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(max(sizehint, 64 * 1024))

    def buffer_updated(self, nbytes: int) -> None:
        self.decoder.buffer_updated(nbytes)
        while not self.closed:
            try:
                message = self.decoder.next()
            except ProtocolError as exc:
                log.warning("worker %s: %s", self.name or "?", exc)
                if exc.fatal:
                    self.close(f"protocol error: {exc}")
                    return
                continue
            if message is None:
                return
            if self.on_message is not None:
                try:
                    self.on_message(message)
                except Exception:  # noqa: BLE001 - a bug here must not look like a lost worker
                    log.exception("engine error while handling %s from worker %s",
                                  MessageType(message.type).name, self.name or "?")
            elif message.type == MessageType.REGISTRATION:
                self._on_registration(self, message)
            else:
                self.close("the first frame was not a REGISTRATION")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        if not was_closed and self.on_lost is not None:
            self.on_lost("connection closed" if exc is None else f"connection lost: {exc}")

    # -- sending ----------------------------------------------------------------------------
    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, msg_type: int, data_type: int, msg_id: int | None, payload: Any) -> int:
        if msg_id is None:
            msg_id = self.next_id()
        if self.transport is not None and not self.closed:
            self.transport.writelines(encode(msg_type, data_type, msg_id, payload))
        return msg_id

    def close(self, why: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if self.on_lost is not None:
            self.on_lost(why or "closed by the engine")


class Claimant(Protocol):
    """Who receives a registered connection (a worker handle waiting for its process)."""

    def accepts_pid(self, pid: int | None) -> bool: ...

    def attach(self, conn: WireConnection, is_control: bool) -> None: ...


class WireListener:
    """The control and data listening sockets shared by every worker of one engine."""

    def __init__(self, control_path: str, data_path: str,
                 features: frozenset[str] = EXTENSIONS) -> None:
        self.control_path = control_path
        self.data_path = data_path
        self.features = features
        self._claims: dict[str, Claimant] = {}
        self._servers: list[asyncio.AbstractServer] = []

    def claim(self, name: str, claimant: Claimant) -> None:
        self._claims[name] = claimant

    def release(self, name: str) -> None:
        self._claims.pop(name, None)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for path, is_control in ((self.control_path, True), (self.data_path, False)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            server = await loop.create_unix_server(
                lambda c=is_control: WireConnection(
                    lambda conn, msg, c=c: self._registered(conn, msg, c)
                ),
                path,
                backlog=128,
            )
            os.chmod(path, 0o600)
            self._servers.append(server)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        for path in (self.control_path, self.data_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _registered(self, conn: WireConnection, message: Message, is_control: bool) -> None:
        payload = message.payload if isinstance(message.payload, dict) else {}
        name = str(payload.get("identifier", ""))
        claimant = self._claims.get(name)
        if claimant is None:
            log.warning("refused worker %r (pid %s): the engine did not start it",
                        name, conn.peer_pid)
            conn.close("unknown worker")
            return
        if not claimant.accepts_pid(conn.peer_pid):
            log.warning("refused a connection for worker %r from pid %s: not that worker's "
                        "process", name, conn.peer_pid)
            conn.close("wrong process")
            return
        conn.name = name
        conn.features = features_from_registration(payload) & self.features
        ack: dict[str, Any] = {"identifier": name}
        if self.features:
            ack[ACK_FEATURES_KEY] = format_features(self.features)
        conn.send(MessageType.ACKNOWLEDGEMENT, DataType.DEFAULT, message.id, ack)
        claimant.attach(conn, is_control)
