"""The engine's end of the worker sockets: asyncio protocols around the shared conversation.

:class:`WireListener` listens on the control and the data socket (in the 0700 runtime
directory), lets each connection's :class:`~worker_sdk.conversation.ServerConversation` check
its REGISTRATION, and hands the connection to whoever claimed that worker name — only workers
the engine itself started are accepted, and the connecting process must be that worker or one
of its descendants (checked with SO_PEERCRED).

Bounded against a hostile worker (every limit is a field of :class:`WireLimits`):

- a connection must register within ``register_timeout_s``, or it is closed;
- at most ``max_unregistered`` connections wait to register at once, and at most
  ``max_unregistered_per_pid`` of them from one process: the rest are closed on accept, so
  20,000 idle connections cost the engine a few dozen file descriptors, not all of them;
- a connection from another user (not root) is closed on accept;
- frames are limited per state: small until registered, then per socket; the decoder's memory
  grows only with the bytes that really arrived;
- a connection whose peer does not read (the write buffer over ``max_write_buffer``) is closed;
- reading pauses by itself: each frame is handled as it is decoded, so a worker that streams
  faster than the engine handles frames fills its own socket buffer and blocks, and
  :meth:`WireConnection.pause_reading` lets the engine push back further;
- refusals are logged through :class:`Throttle`: the first few of a kind, then a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from supervisor.clock import monotonic
from worker_sdk.connection import peer_credentials
from worker_sdk.conversation import (
    CONTROL_MAX_FRAME,
    MAX_UNANSWERED,
    Channel,
    ServerConversation,
)
from worker_sdk.events import Event, Ping, Pong, Registration
from worker_sdk.protocol import DEFAULT_MAX_FRAME, KNOWN_FEATURES, ProtocolError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WireLimits:
    """What one engine grants the processes that connect to its worker sockets."""

    register_timeout_s: float = 5.0
    max_unregistered: int = 64
    max_unregistered_per_pid: int = 8
    registration_frame: int = 64 * 1024
    control_frame: int = CONTROL_MAX_FRAME
    data_frame: int = DEFAULT_MAX_FRAME
    max_write_buffer: int = DEFAULT_MAX_FRAME + 1024 * 1024
    max_tracked_pings: int = 64


class Throttle:
    """Log at most ``burst`` messages per key in each ``window_s``; then say how many were not."""

    def __init__(self, logger: logging.Logger, burst: int = 5, window_s: float = 10.0,
                 clock: Callable[[], float] = monotonic) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (start, logged, dropped)

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = self.clock()
        start, logged, dropped = self._windows.get(key, (now, 0, 0))
        if now - start >= self.window_s:
            if dropped:
                self.logger.warning("(%d more like this in %.0f s: %s)", dropped,
                                    now - start, key)
            start, logged, dropped = now, 0, 0
        if logged < self.burst:
            self.logger.warning(msg, *args)
            logged += 1
        else:
            dropped += 1
        self._windows[key] = (start, logged, dropped)
        if len(self._windows) > 1024:  # keys are bounded: forget the oldest windows
            for old in list(self._windows)[:512]:
                del self._windows[old]


class WireConnection(asyncio.BufferedProtocol):
    """One accepted connection: bytes into its conversation, typed events out, frames back."""

    def __init__(self, listener: WireListener, is_control: bool) -> None:
        self.listener = listener
        self.is_control = is_control
        self.conversation = ServerConversation(
            Channel.CONTROL if is_control else Channel.DATA, offered=listener.features,
            max_frame_size=listener.limits.registration_frame)
        self.transport: asyncio.Transport | None = None
        self.peer_pid: int | None = None
        self.peer_uid: int | None = None
        self.name: str | None = None
        self.on_event: Callable[[Event], None] | None = None
        self.on_refused: Callable[[ProtocolError], None] | None = None
        self.on_lost: Callable[[str], None] | None = None
        self.closed = False
        self.closed_by_engine = False  # the engine gave up on it (not the worker's own close)
        self._pings: dict[int, float] = {}  # unanswered ping id -> when it was sent
        self.last_pong_at: float | None = None

    @property
    def features(self) -> frozenset[str]:
        """The extensions negotiated on this connection (empty until it registered)."""
        return self.conversation.features

    @property
    def decoder_capacity(self) -> int:
        return self.conversation.decoder.capacity

    # -- asyncio.BufferedProtocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (cast: another loop's transports, uvloop's, are not asyncio.Transport's subclasses)
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                self.peer_pid, self.peer_uid, _gid = peer_credentials(sock)
        self.listener.admit(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conversation.get_buffer(max(sizehint, 64 * 1024))

    def buffer_updated(self, nbytes: int) -> None:
        conv = self.conversation
        conv.buffer_updated(nbytes)
        while not self.closed:
            try:
                event = conv.next_event()
            except ProtocolError as exc:
                self.listener.throttle.warning(
                    f"refused:{self.name or self.peer_pid}", "worker %s (pid %s): %s",
                    self.name or "?", self.peer_pid, exc)
                if exc.fatal:
                    if not conv.registered:
                        self.listener.registration_refused(self, str(exc))
                    self.close(f"protocol error: {exc}")
                    return
                if self.on_refused is not None:
                    self.on_refused(exc)
                continue
            if event is None:
                return
            if type(event) is Pong:
                self._answered(event.id)
            if self.on_event is not None:
                try:
                    self.on_event(event)
                except Exception:  # noqa: BLE001 - a bug here must not look like a lost worker
                    log.exception("engine error while handling %s from worker %s",
                                  type(event).__name__, self.name or "?")
            elif type(event) is Registration:
                self.listener.registered(self, event)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        self.listener.forget(self)
        if not was_closed and self.on_lost is not None:
            self.on_lost("connection closed" if exc is None else f"connection lost: {exc}")

    # -- sending ----------------------------------------------------------------------------
    def next_id(self) -> int:
        return self.conversation.next_id()

    def send(self, event: Event) -> None:
        """Write ``event`` (nothing once closed); a peer that stops reading is cut off."""
        transport = self.transport
        if transport is None or self.closed:
            return
        transport.writelines(self.conversation.send(event))
        if transport.get_write_buffer_size() > self.listener.limits.max_write_buffer:
            self.close(f"the worker does not read its {self.conversation.channel.value} "
                       f"socket ({transport.get_write_buffer_size()} bytes unsent)")

    def ping(self) -> int:
        """Send a PING (the worker answers on the same socket, even while busy); its id.

        :meth:`oldest_unanswered_ping_s` says how long the oldest unanswered one has waited.
        """
        ping_id = self.next_id()
        if self.conversation.unanswered_pings >= MAX_UNANSWERED:
            return ping_id  # a worker this far behind is hung: the age says so, no need to send
        self.send(Ping(ping_id))
        if len(self._pings) < self.listener.limits.max_tracked_pings:
            self._pings[ping_id] = monotonic()
        return ping_id

    def oldest_unanswered_ping_s(self, now: float | None = None) -> float | None:
        """Seconds since the oldest unanswered PING was sent; None when all were answered."""
        for sent in self._pings.values():
            return (monotonic() if now is None else now) - sent
        return None

    def _answered(self, pong_id: int) -> None:
        self.last_pong_at = monotonic()
        for ping_id in list(self._pings):  # answered in order: the older ones were too
            del self._pings[ping_id]
            if ping_id == pong_id:
                break

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self, why: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        self.closed_by_engine = True
        self.listener.forget(self)
        if self.transport is not None:
            self.transport.abort()  # nothing more is owed to a connection we give up on
        if self.on_lost is not None:
            self.on_lost(why or "closed by the engine")


class Claimant(Protocol):
    """Who receives a registered connection (a worker handle waiting for its process).

    ``registration_refused(why)`` is called, when a claimant has it, if its process sent a
    registration the protocol refuses (so it can say why, not wait for its start time-out).
    ``when_started(then)``, when a claimant has it, returns True while its process is being
    started and its pid is not known yet, and then calls ``then`` once it is (or the start
    failed).
    """

    def accepts_pid(self, pid: int | None) -> bool: ...

    def attach(self, conn: WireConnection, is_control: bool) -> None: ...


class WireListener:
    """The control and data listening sockets shared by every worker of one engine."""

    def __init__(self, control_path: str, data_path: str,
                 features: frozenset[str] = KNOWN_FEATURES,
                 limits: WireLimits | None = None) -> None:
        self.control_path = control_path
        self.data_path = data_path
        self.features = features
        self.limits = limits or WireLimits()
        self.throttle = Throttle(log)
        self._claims: dict[str, Claimant] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._waiting: dict[WireConnection, asyncio.TimerHandle | None] = {}
        self._waiting_per_pid: dict[int | None, int] = {}
        self.refused_connections = 0  # closed on accept (over a limit, or another user)
        self._told: set[int] = set()  # pids whose refused registration a claimant heard of

    def claim(self, name: str, claimant: Claimant) -> None:
        self._claims[name] = claimant

    def release(self, name: str) -> None:
        self._claims.pop(name, None)

    @property
    def unregistered(self) -> int:
        """Connections accepted and waiting to register."""
        return len(self._waiting)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for path, is_control in ((self.control_path, True), (self.data_path, False)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            server = await loop.create_unix_server(
                lambda c=is_control: WireConnection(self, c), path, backlog=128)
            os.chmod(path, 0o600)
            self._servers.append(server)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()
        for conn in list(self._waiting):
            conn.close("the engine is stopping")
        for path in (self.control_path, self.data_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- admission ------------------------------------------------------------------------
    def admit(self, conn: WireConnection) -> None:
        """Take a new connection into the registration wait, or refuse it at once."""
        limits = self.limits
        pid = conn.peer_pid
        why = None
        if conn.peer_uid is not None and conn.peer_uid not in (os.getuid(), 0):
            why = f"uid {conn.peer_uid} is not the engine's user"
        elif len(self._waiting) >= limits.max_unregistered:
            why = f"{len(self._waiting)} connections already wait to register"
        elif self._waiting_per_pid.get(pid, 0) >= limits.max_unregistered_per_pid:
            why = f"pid {pid} has {limits.max_unregistered_per_pid} unregistered connections"
        if why is not None:
            self.refused_connections += 1
            self.throttle.warning("refused connection", "refused a worker-socket connection "
                                  "from pid %s: %s", pid, why)
            conn.close(why)
            return
        self._waiting[conn] = asyncio.get_running_loop().call_later(
            limits.register_timeout_s, self._expire, conn)
        self._waiting_per_pid[pid] = self._waiting_per_pid.get(pid, 0) + 1

    def _expire(self, conn: WireConnection) -> None:
        if conn in self._waiting:
            self._waiting[conn] = None
            self.throttle.warning("registration timeout", "closed a worker-socket connection "
                                  "from pid %s: no registration within %g s", conn.peer_pid,
                                  self.limits.register_timeout_s)
            conn.close("no registration in time")

    def forget(self, conn: WireConnection) -> None:
        """``conn`` registered or went away: it no longer counts as waiting."""
        if conn not in self._waiting:
            return
        timer = self._waiting.pop(conn)
        if timer is not None:
            timer.cancel()
        left = self._waiting_per_pid.get(conn.peer_pid, 1) - 1
        if left > 0:
            self._waiting_per_pid[conn.peer_pid] = left
        else:
            self._waiting_per_pid.pop(conn.peer_pid, None)

    def registration_refused(self, conn: WireConnection, why: str) -> None:
        """Tell the claimant whose process sent a refused registration (once per pid); a
        claimant still starting (its pid not known yet: the process connected before its
        start returned) is asked once it is known, as for a registration."""
        pid = conn.peer_pid
        if pid is None or pid in self._told or len(self._told) > 4096:
            return
        for claimant in list(self._claims.values()):
            later = getattr(claimant, "when_started", None)
            if later is not None and later(lambda c=claimant: self._tell_refused(c, pid, why)):
                continue
            if self._tell_refused(claimant, pid, why):
                return

    def _tell_refused(self, claimant: Claimant, pid: int, why: str) -> bool:
        refused = getattr(claimant, "registration_refused", None)
        if pid in self._told or refused is None or not claimant.accepts_pid(pid):
            return False
        self._told.add(pid)
        refused(why)
        return True

    def registered(self, conn: WireConnection, reg: Registration) -> None:
        self.forget(conn)
        claimant = self._claims.get(reg.name)
        if claimant is None:
            self.throttle.warning("unknown worker", "refused worker %r (pid %s): the engine "
                                  "did not start it", reg.name, conn.peer_pid)
            conn.close("unknown worker")
            return
        # A process can connect before its start has returned its pid to the engine (the
        # loop turns while the start completes): decided once the pid is known.
        later = getattr(claimant, "when_started", None)
        if later is not None and later(lambda: self._claimed(conn, reg, claimant)):
            return
        self._claimed(conn, reg, claimant)

    def _claimed(self, conn: WireConnection, reg: Registration, claimant: Claimant) -> None:
        if self._claims.get(reg.name) is not claimant or conn.transport is None \
                or conn.transport.is_closing():
            conn.close("its worker is gone")
            return
        if not claimant.accepts_pid(conn.peer_pid):
            self.throttle.warning("wrong process", "refused a connection for worker %r from "
                                  "pid %s: not that worker's process", reg.name, conn.peer_pid)
            conn.close("wrong process")
            return
        conn.name = reg.name
        limits = self.limits
        conn.conversation.max_frame_size = \
            limits.control_frame if conn.is_control else limits.data_frame
        if conn.transport is not None:
            conn.transport.writelines(conn.conversation.acknowledge())
        claimant.attach(conn, conn.is_control)
