"""One control client's connection: hello, requests in, replies and pushed events out.

The connection admits its peer (SO_PEERCRED, connection limit) through the server, reads
frames with :class:`RequestReader` (an oversized request is skipped and answered), passes
requests to :class:`Methods`, and pushes the events of its subscriptions — dropping them,
counted, while its write buffer is over the server's ``subscriber_buffer``, and sending the
latest snapshot with the count once it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from worker_sdk.protocol import DataType, EventType, Message, MessageType, ProtocolError, encode

from ..errors import VramtuiError
from ..events import EngineEvent, Subscription
from . import messages as m
from .codec import event_to_wire, snapshot_to_wire
from .errors import (
    AccessDenied,
    BadRequest,
    ProtocolMismatch,
    RequestTooLarge,
    TooManyConnections,
    error_to_wire,
)
from .peer import PeerCred, peer_cred
from .reader import Oversized, RequestReader

if TYPE_CHECKING:
    from .methods import Waiter
    from .server import ControlServer

HELLO_TIMEOUT_S = 10.0


class Connection(asyncio.BufferedProtocol):
    """One client: hello, then requests; events pushed to its subscriptions."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.reader = RequestReader(server.max_request)
        self.transport: asyncio.Transport | None = None
        self.peer: PeerCred | None = None
        self.hello = False
        self.closed = False
        self.paused = False
        self.subs: dict[int, Subscription] = {}
        self.lag: dict[int, int] = {}
        self.waiters: set[Waiter] = set()
        self._sub_ids = 0
        self._hello_timer: asyncio.TimerHandle | None = None

    # -- asyncio protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            self.peer = peer_cred(sock)
        why = self.server.admit(self, self.peer)
        if why is not None:
            exc = AccessDenied(why) if "permission" in why else TooManyConnections(why)
            self.closed = True
            self._send(MessageType.ERROR, 0, error_to_wire(exc))
            transport.close()
            return
        transport.set_write_buffer_limits(high=self.server.subscriber_buffer)
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, self._hello_expired)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(max(sizehint, 64 * 1024))

    def buffer_updated(self, nbytes: int) -> None:
        for item in self.reader.buffer_updated(nbytes):
            if self.closed:
                return
            if isinstance(item, Message):
                self._on_message(item)
            elif isinstance(item, Oversized):
                self._on_oversized(item)
            else:
                self._on_protocol_error(item)
        if self.reader.dead:
            self.close()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is None or self.closed:
            return
        self.transport.resume_reading()
        lagged = {sub: n for sub, n in self.lag.items() if n}
        if lagged:
            snap = snapshot_to_wire(self.server.engine.snapshot(), m.SNAPSHOT_JOB_DATA_LIMIT)
            for sub, n in lagged.items():
                self.lag[sub] = 0
                self._send(MessageType.EVENT, 0, {"event": int(EventType.NOTIFY), "sub": sub,
                                                  "lagged": n, "snapshot": snap})

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    # -- messages ---------------------------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        if msg.type == MessageType.REQUEST and self.hello:
            self.server.methods.dispatch(self, msg)
        elif msg.type == MessageType.REGISTRATION and not self.hello:
            self._on_hello(msg)
        elif msg.type == MessageType.PING:
            self._send(MessageType.PONG, msg.id, msg.payload)
        elif not self.hello:
            self.error(msg.id, BadRequest("say hello first: send a REGISTRATION frame"))
            self.close()
        else:
            self.error(msg.id, BadRequest(f"unexpected {MessageType(msg.type).name} frame"))

    def _on_hello(self, msg: Message) -> None:
        payload = msg.payload if isinstance(msg.payload, dict) else {}
        meta = payload.get("metadata") if isinstance(payload.get("metadata"), dict) else {}
        version = str(meta.get("protocol", "")) if isinstance(meta, dict) else ""
        if version != m.PROTOCOL:
            self.error(msg.id, ProtocolMismatch(
                f"this engine speaks control protocol {m.PROTOCOL}, the client {version or '?'}"
                "; use the same vramtui version for both"))
            self.close()
            return
        self.hello = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        srv = self.server
        self._send(MessageType.ACKNOWLEDGEMENT, msg.id, {
            "identifier": m.SERVER_ID, "protocol": m.PROTOCOL, "version": srv.version,
            "pid": os.getpid(), "mode": srv.mode, "socket": str(srv.path),
            "max_request": srv.max_request})

    def _on_oversized(self, item: Oversized) -> None:
        self.server.counters["oversized"] += 1
        self.server.ratelog.warning("oversized", f"a control request of {item.length} bytes "
                                    f"from pid {self.peer.pid if self.peer else '?'} is over "
                                    f"the {item.limit}-byte limit; refused")
        self.error(item.msg_id, RequestTooLarge(
            f"request too large: {m.format_size(item.length)} ({item.length} bytes) is over "
            f"the control socket's limit of {m.format_size(item.limit)} ({item.limit} bytes)",
            length=item.length, limit=item.limit))
        if item.fatal:
            self.close()

    def _on_protocol_error(self, exc: ProtocolError) -> None:
        self.error(exc.message_id or 0, BadRequest(f"malformed request: {exc}"))
        if exc.fatal:
            self.close()

    def _hello_expired(self) -> None:
        if not self.hello:
            self.error(0, BadRequest(f"no hello within {HELLO_TIMEOUT_S:g} s"))
            self.close()

    # -- replies and events ---------------------------------------------------------------
    def reply(self, msg_id: int, result: Any) -> None:
        try:
            frames = encode(MessageType.RESPONSE, DataType.DEFAULT, msg_id, {"r": result})
        except (TypeError, ValueError, OverflowError) as exc:
            self.error(msg_id, VramtuiError(f"the engine cannot serialise its reply: {exc}"))
            return
        if self.transport is not None and not self.closed:
            self.transport.writelines(frames)

    def error(self, msg_id: int, exc: BaseException) -> None:
        self._send(MessageType.ERROR, msg_id, error_to_wire(exc))

    def _send(self, msg_type: int, msg_id: int, payload: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            frames = encode(msg_type, DataType.DEFAULT, msg_id, payload)
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. odd metadata
            self.server.ratelog.warning("encode", f"cannot send a {msg_type} frame to a "
                                        f"control client: {exc}")
            return
        transport.writelines(frames)

    def subscribe(self, kinds: frozenset[str] | None, job: str | None) -> int:
        self._sub_ids += 1
        sub_id = self._sub_ids

        def offer(event: EngineEvent) -> None:
            self._push(sub_id, job, event)

        self.subs[sub_id] = self.server.engine.events.subscribe(
            maxsize=1, kinds=kinds, callback=offer)
        self.lag[sub_id] = 0
        return sub_id

    def unsubscribe(self, sub_id: int) -> None:
        sub = self.subs.pop(sub_id, None)
        self.lag.pop(sub_id, None)
        if sub is not None:
            sub.close()

    def _push(self, sub_id: int, job: str | None, event: EngineEvent) -> None:
        if self.closed:
            return
        if event.kind == "closed":
            self._send(MessageType.EVENT, 0, {"event": int(EventType.SHUTDOWN), "sub": sub_id})
            return
        if job is not None and event.job_id != job and (event.job is None
                                                        or event.job.id != job):
            return
        if self.paused:
            self.lag[sub_id] = self.lag.get(sub_id, 0) + 1
            self.server.counters["dropped_events"] += 1
            return
        self._send(MessageType.EVENT, 0, {"event": int(EventType.NOTIFY), "sub": sub_id,
                                          "e": event_to_wire(event)})

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._teardown()

    def _teardown(self) -> None:
        if self.closed and self not in self.server.connections:
            return
        self.closed = True
        self.server.connections.discard(self)
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        for sub_id in list(self.subs):
            self.unsubscribe(sub_id)
        for waiter in list(self.waiters):
            waiter.drop()
        self.waiters.clear()
