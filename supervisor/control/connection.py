"""One control client's connection: hello, requests in, replies and pushed events out.

The connection admits its peer (SO_PEERCRED, connection limits) through the server, reads
frames with :class:`RequestReader` (an oversized or, when the server is busy, a large request
is skipped and answered), passes requests to :class:`Methods`, and pushes the events of its
subscriptions.

Back-pressure, so that what a client makes the engine hold stays bounded (see
:mod:`.limits`): while more than ``write_high`` bytes wait to be sent, the connection stops
reading and stops answering — decoded requests wait (at most one read's worth), replies that
come due meanwhile (a ``wait`` whose job ended) wait as small records, events are dropped and
counted, and the latest snapshot with the count is sent once it drains.  A client that leaves
its replies unread too long, sends half a frame and stops, or stays idle, is cut off by the
server's sweep with a logged reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from supervisor.clock import monotonic
from worker_sdk.protocol import DataType, EventType, Message, MessageType, ProtocolError, encode

from ..errors import VramtuiError
from ..events import EngineEvent, Subscription
from ..units import bytes_text
from . import messages as m
from .codec import event_to_wire, snapshot_to_wire
from .errors import (
    AccessDenied,
    BadRequest,
    EngineBusy,
    ProtocolMismatch,
    RequestTooLarge,
    TooManyConnections,
    error_to_wire,
)
from .peer import PeerCred, peer_cred
from .reader import Busy, Item, Oversized, RequestReader

if TYPE_CHECKING:
    from .methods import Waiter
    from .server import ControlServer

HELLO_TIMEOUT_S = 10.0  # the default of ControlLimits.hello_timeout_s, for messages


def _nbytes(part: bytes | memoryview) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


class Connection(asyncio.BufferedProtocol):
    """One client: hello, then requests; events pushed to its subscriptions."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.limits = server.limits
        self.reader = RequestReader(server.max_request, admit=server.reserve_receiving,
                                    release=server.release_receiving)
        self.transport: asyncio.Transport | None = None
        self.peer: PeerCred | None = None
        self.owner = False  # the engine's own user or root (see ControlServer.admit)
        self.hello = False
        self.closed = False
        self.paused = False
        self.subs: dict[int, Subscription] = {}
        self.lag: dict[int, int] = {}
        self.waiters: set[Waiter] = set()
        self.deferred = 0  # replies being prepared elsewhere (a log read in a thread)
        self._sub_ids = 0
        now = monotonic()
        self.opened = now
        self.last_active = now
        self.paused_since: float | None = None
        self.partial_since: float | None = None
        self._frames_seen = 0
        self._pending: deque[Item] = deque()  # decoded, not handled yet (we are paused)
        self._outbox: deque[tuple[int, int, Any]] = deque()  # replies due while paused

    # -- asyncio protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (cast: another loop's transports, uvloop's, are not asyncio.Transport's subclasses)
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            self.peer = peer_cred(sock)
        why = self.server.admit(self, self.peer)
        if why is not None:
            exc = AccessDenied(why) if "permission" in why else TooManyConnections(why)
            self.closed = True
            self._send_now(MessageType.ERROR, 0, error_to_wire(exc))
            transport.close()
            self.reader.close()
            return
        transport.set_write_buffer_limits(high=self.server.subscriber_buffer)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        now = monotonic()
        self.last_active = now
        self._pending.extend(self.reader.buffer_updated(nbytes))
        if self.reader.partial:
            started = self.reader.frames_begun
            if started != self._frames_seen or self.partial_since is None:
                self._frames_seen = started
                self.partial_since = now
        else:
            self.partial_since = None
        self._process()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.paused = True
        self.paused_since = monotonic()
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.paused_since = None
        if self.transport is None or self.closed:
            return
        while self._outbox and not self.paused and not self.closed:
            self._send_now(*self._outbox.popleft())
        if self.paused or self.closed:
            return
        lagged = {sub: n for sub, n in self.lag.items() if n}
        if lagged:
            snap = snapshot_to_wire(self.server.engine.snapshot(), m.SNAPSHOT_JOB_DATA_LIMIT)
            for sub, n in lagged.items():
                self.lag[sub] = 0
                self._send_now(MessageType.EVENT, 0, {"event": int(EventType.NOTIFY),
                                                      "sub": sub, "lagged": n, "snapshot": snap})
        self._process()
        if not self.paused and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown()

    # -- what the server's sweep and admission look at ------------------------------------
    @property
    def busy(self) -> bool:
        """Something is in flight for this client (it must not be evicted for being idle); a
        frame that trickles in past its grace does not count (see :meth:`dribbling`)."""
        if not self.hello:
            return False
        transport = self.transport
        return bool(self.subs or self.waiters or self.deferred or self._pending or self._outbox
                    or (self.reader.partial and not self.dribbling(monotonic()))
                    or (transport is not None and transport.get_write_buffer_size()))

    def dribbling(self, now: float) -> bool:
        """No hello yet, or a frame still incomplete, ``partial_grace_s`` after it began: a
        client on the same machine sends a frame in one go."""
        grace = self.limits.partial_grace_s
        if not self.hello:
            return now - self.opened > grace
        return self.partial_since is not None and now - self.partial_since > grace

    @property
    def long_lived(self) -> bool:
        """It holds a subscription or a wait (it may stay for long, legitimately)."""
        return bool(self.subs or self.waiters)

    @property
    def unsent(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def check_deadlines(self, now: float) -> None:
        """Called by the server's sweep: cut off what overstayed a limit."""
        lim = self.limits
        if self.closed:
            return
        if not self.hello:
            if now - self.opened > lim.hello_timeout_s:
                self.error(0, BadRequest(f"no hello within {lim.hello_timeout_s:g} s"))
                self.cut(f"no hello within {lim.hello_timeout_s:g} s", abort=False,
                         counter="idle_closed")
            return
        if self.partial_since is not None and now - self.partial_since > lim.frame_timeout_s:
            self.cut(f"a request frame begun {lim.frame_timeout_s:g} s ago is still not "
                     "complete")
        elif self.paused_since is not None and now - self.paused_since > lim.stall_timeout_s:
            self.cut(f"it has not read its replies for {lim.stall_timeout_s:g} s "
                     f"({bytes_text(self.unsent)} unsent)")
        elif not self.busy and now - self.last_active > lim.idle_timeout_s:
            self.cut(f"idle for {lim.idle_timeout_s:g} s", abort=False, counter="idle_closed")

    def cut(self, reason: str, *, abort: bool = True, counter: str = "cut_off") -> None:
        """Close this connection because it went over a limit; the reason is logged (rate
        limited) and counted.  ``abort`` drops whatever is still unsent at once."""
        if self.closed:
            return
        srv = self.server
        srv.counters[counter] += 1
        who = (f"pid {self.peer.pid} uid {self.peer.uid}" if self.peer is not None
               else "an unknown peer")
        text = f"closed the control connection of {who}: {reason}"
        if counter == "idle_closed":
            srv.ratelog.info(counter, text)
        else:
            srv.ratelog.warning(f"{counter}:{reason[:20]}", text)
        transport = self.transport
        if transport is not None and abort:
            transport.abort()
        self.close()

    # -- messages ---------------------------------------------------------------------------
    def _process(self) -> None:
        """Handle decoded items while the client reads its replies (one at a time)."""
        while self._pending and not self.paused and not self.closed:
            item = self._pending.popleft()
            if isinstance(item, Message):
                self._on_message(item)
            elif isinstance(item, Oversized):
                self._on_oversized(item)
            elif isinstance(item, Busy):
                self._on_busy(item)
            else:
                self._on_protocol_error(item)
        if self.reader.dead and not self._pending:
            self.close()

    def _on_message(self, msg: Message) -> None:
        if msg.type == MessageType.REQUEST and self.hello:
            self.server.methods.dispatch(self, msg)
        elif msg.type == MessageType.REGISTRATION and not self.hello:
            self._on_hello(msg)
        elif msg.type == MessageType.PING:
            self._send_now(MessageType.PONG, msg.id, msg.payload)
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
        srv = self.server
        self._send_now(MessageType.ACKNOWLEDGEMENT, msg.id, {
            "identifier": m.SERVER_ID, "protocol": m.PROTOCOL, "version": srv.version,
            "pid": os.getpid(), "mode": srv.mode, "socket": str(srv.path),
            "max_request": srv.max_request})

    def _on_oversized(self, item: Oversized) -> None:
        self.server.counters["oversized"] += 1
        self.server.ratelog.warning("oversized", f"a control request of {item.length} bytes "
                                    f"from pid {self.peer.pid if self.peer else '?'} is over "
                                    f"the {item.limit}-byte limit; refused")
        self.error(item.msg_id, RequestTooLarge(
            f"request too large: {bytes_text(item.length)} ({item.length} bytes) is over "
            f"the control socket's limit of {bytes_text(item.limit)} ({item.limit} bytes)",
            length=item.length, limit=item.limit))
        if item.fatal:
            self.close()

    def _on_busy(self, item: Busy) -> None:
        srv = self.server
        srv.counters["busy"] += 1
        srv.ratelog.warning("busy", f"a control request of {bytes_text(item.length)} from "
                            f"pid {self.peer.pid if self.peer else '?'} was refused: "
                            f"{bytes_text(srv.receiving)} of large requests are being "
                            f"received already (the limit is "
                            f"{bytes_text(self.limits.max_receiving)})")
        self.error(item.msg_id, EngineBusy(
            f"the engine is receiving other large requests ({bytes_text(srv.receiving)} at "
            f"the moment, {bytes_text(self.limits.max_receiving)} at most); try again in "
            "a moment"))

    def _on_protocol_error(self, exc: ProtocolError) -> None:
        self.error(exc.message_id or 0, BadRequest(f"malformed request: {exc}"))
        if exc.fatal:
            self.close()

    # -- replies and events ---------------------------------------------------------------
    def reply(self, msg_id: int, result: Any) -> None:
        self._answer(MessageType.RESPONSE, msg_id, {"r": result})

    def error(self, msg_id: int, exc: BaseException) -> None:
        self._answer(MessageType.ERROR, msg_id, error_to_wire(exc))

    def _answer(self, msg_type: int, msg_id: int, payload: Any) -> None:
        """Send a reply now, or keep it (not encoded) until the client reads what it has."""
        if self.closed or self.transport is None:
            return
        if self.paused or self._outbox:
            self._outbox.append((msg_type, msg_id, payload))
            return
        self._send_now(msg_type, msg_id, payload)

    def _send_now(self, msg_type: int, msg_id: int, payload: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            frames = encode(msg_type, DataType.DEFAULT, msg_id, payload)
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. odd metadata
            self.server.ratelog.warning("encode", f"cannot send a {msg_type} frame to a "
                                        f"control client: {exc}")
            if msg_type == MessageType.RESPONSE:
                self._send_now(MessageType.ERROR, msg_id, error_to_wire(VramtuiError(
                    f"the engine cannot serialise its reply: {exc}")))
            return
        size = sum(_nbytes(f) for f in frames)
        if size > self.limits.max_reply and msg_type != MessageType.ERROR:
            self.server.counters["replies_too_large"] += 1
            self._send_now(MessageType.ERROR, msg_id, error_to_wire(VramtuiError(
                f"the reply would be {bytes_text(size)}, over the control socket's limit "
                f"of {bytes_text(self.limits.max_reply)} for one reply; ask for less "
                "(a snapshot's data_limit, one job at a time)")))
            return
        transport.writelines(frames)
        self.last_active = monotonic()
        if transport.get_write_buffer_size() > self.limits.max_unsent:
            self.cut(f"{bytes_text(transport.get_write_buffer_size())} of replies unsent, "
                     f"over the limit of {bytes_text(self.limits.max_unsent)}")

    def check_wait(self) -> None:
        """Raise unless this connection may hold one more wait."""
        if len(self.waiters) >= self.limits.max_waits:
            raise TooManyConnections(f"{len(self.waiters)} waits in flight on one connection "
                                     f"(the limit is {self.limits.max_waits}); wait for some "
                                     "to end, or use more connections")
        self.server.check_long_lived(self)

    def check_subscribe(self) -> None:
        """Raise unless this connection may hold one more subscription."""
        if len(self.subs) >= self.limits.max_subscriptions:
            raise TooManyConnections(f"{len(self.subs)} subscriptions on one connection (the "
                                     f"limit is {self.limits.max_subscriptions})")
        self.server.check_long_lived(self)

    def subscribe(self, kinds: frozenset[str] | None, job: str | None) -> int:
        self.check_subscribe()
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
            self._send_now(MessageType.EVENT, 0, {"event": int(EventType.SHUTDOWN),
                                                  "sub": sub_id})
            return
        if job is not None and event.job_id != job and (event.job is None
                                                        or event.job.id != job):
            return
        if self.paused:
            self.lag[sub_id] = self.lag.get(sub_id, 0) + 1
            self.server.counters["dropped_events"] += 1
            return
        self._send_now(MessageType.EVENT, 0, {"event": int(EventType.NOTIFY), "sub": sub_id,
                                              "e": event_to_wire(event)})

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._teardown()

    def _teardown(self) -> None:
        if self.closed and self not in self.server.connections:
            self.reader.close()
            return
        self.closed = True
        self.server.connections.discard(self)
        self.reader.close()
        self._pending.clear()
        self._outbox.clear()
        for sub_id in list(self.subs):
            self.unsubscribe(sub_id)
        for waiter in list(self.waiters):
            waiter.drop()
        self.waiters.clear()
