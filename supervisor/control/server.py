"""The control server: the engine's whole API on a Unix socket, served on the engine loop.

It runs on the engine's own asyncio loop and calls the engine's methods directly (they are
synchronous and loop-only), so no request ever waits for a thread.  ``wait`` never blocks the
loop: the reply is sent from the job's future callback.

Security: the socket lives in the 0700 runtime directory and is itself 0600; every peer's uid
is checked with SO_PEERCRED (the engine's user and root get in; a refused peer is logged with
its uid and pid and told why).  With ``allow_group`` the socket becomes 0660 owned by that
group, and the runtime directory 0710 with that group — members may reach the socket by name
but not list or create anything there; every directory above must be searchable by them (we
log which one is not).  The directory goes back to 0700 when the server closes.

The directory the socket is bound in must be a real directory of ours that nobody else can
write (the engine's runtime directory, see :mod:`supervisor.paths`): only then can nobody swap
the name between ``bind`` and ``chmod``.

Limits (every figure in :class:`.limits.ControlLimits`): a request frame over ``max_request``
bytes is read and thrown away and answered with an error naming the limit; large frames being
received share one budget, beyond which they are skipped and answered "busy"; a client that
does not read gets nothing new (requests wait, events are dropped and counted, and it is sent
the latest snapshot with the count of missed events when it catches up) and is cut off when it
stays so too long; half frames, silent and idle clients are cut off past their deadlines; at
most ``max_connections`` clients at a time — when all are taken, the one idle the longest
gives way, a few slots are kept for the engine's own user, and subscriptions and waits may
never take the last ones.  Every cut-off is logged (at most once every few seconds per kind)
and counted in ``stats()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.clock import monotonic

from ..errors import VramtuiError
from ..paths import user_name
from .connection import Connection
from .errors import TooManyConnections
from .limits import ControlLimits
from .methods import Methods
from .peer import PeerCred, is_allowed, refusal

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("supervisor.control")

SUBSCRIBER_BUFFER = ControlLimits.write_high


class _RateLog:
    """Log a recurring warning at most once per ``period`` seconds, counting the rest."""

    def __init__(self, period: float = 5.0) -> None:
        self.period = period
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, text: str) -> None:
        self._log(logging.WARNING, key, text)

    def info(self, key: str, text: str) -> None:
        self._log(logging.INFO, key, text)

    def _log(self, level: int, key: str, text: str) -> None:
        now = monotonic()
        if now - self._last.get(key, -1e9) < self.period:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        extra = self._suppressed.pop(key, 0)
        self._last[key] = now
        log.log(level, "%s%s", text, f" (and {extra} more like it)" if extra else "")


class ControlServer:
    """Serves one engine on ``socket_path``; a facade service (``start`` / ``close``)."""

    def __init__(self, engine: Engine, socket_path: str | os.PathLike[str], *,
                 mode: str = "serve", version: str = "", allow_group: int | None = None,
                 max_request: int | None = None, max_connections: int | None = None,
                 subscriber_buffer: int | None = None, limits: ControlLimits | None = None,
                 on_ready: Callable[[ControlServer], None] | None = None) -> None:
        limits = limits or ControlLimits()
        overrides = {name: value for name, value in (
            ("max_request", max_request), ("max_connections", max_connections),
            ("write_high", subscriber_buffer)) if value is not None}
        if overrides:
            limits = dataclasses.replace(limits, **overrides)
        self.limits = limits
        self.engine = engine
        self.path = Path(socket_path)
        self.mode = mode
        self.version = version
        self.allow_group = allow_group
        self.max_request = limits.max_request
        self.max_connections = limits.max_connections
        self.subscriber_buffer = limits.write_high
        # Slots kept for the engine's own user: never more than a quarter of them all.
        self.reserve = min(limits.owner_reserve, limits.max_connections // 4)
        self.on_ready = on_ready
        self.owner_uid = os.geteuid()
        self.connections: set[Connection] = set()
        self.receiving = 0  # bytes of large request frames being received (all connections)
        self.counters = {"accepted": 0, "refused": 0, "over_limit": 0, "oversized": 0,
                         "dropped_events": 0, "requests": 0, "evicted": 0, "cut_off": 0,
                         "idle_closed": 0, "busy": 0, "replies_too_large": 0}
        self.ratelog = _RateLog()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._server: asyncio.AbstractServer | None = None
        self._serving: asyncio.Task[asyncio.AbstractServer] | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.methods = Methods(self)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and listen now (on the engine loop); connections are accepted from the next
        iteration.  Raises OSError / VramtuiError with a one-line message."""
        self.loop = asyncio.get_running_loop()
        path = str(self.path)
        _check_private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale socket: the engine lock says it is ours to replace
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
            if self.allow_group is not None:
                self._open_to_group()
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        self._sock = sock
        self._inode = os.stat(path).st_ino
        self._serving = self.loop.create_task(self.loop.create_unix_server(
            lambda: Connection(self), sock=sock, backlog=128))
        log.info("control socket %s (%s, mode %o)", path, self.mode,
                 0o660 if self.allow_group is not None else 0o600)
        self._sweeper = self.loop.call_later(self.limits.sweep_s, self._sweep)
        if self.on_ready is not None:
            self.on_ready(self)

    def _open_to_group(self) -> None:
        gid = self.allow_group
        assert gid is not None
        path, directory = str(self.path), self.path.parent
        try:
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
            os.chown(directory, -1, gid)
            os.chmod(directory, 0o710)
        except OSError as exc:
            raise VramtuiError(f"--allow-group: cannot give group {gid} access to {path}: "
                               f"{exc.strerror} (you must be a member of that group)") from None
        for parent in directory.parents:
            with contextlib.suppress(OSError):
                st = os.stat(parent)
                if not st.st_mode & stat.S_IXOTH and not (
                        st.st_gid == gid and st.st_mode & stat.S_IXGRP):
                    log.warning("--allow-group: group %s cannot reach the socket: %s is not "
                                "searchable by it (set VRAMTUI_RUNTIME_DIR elsewhere)", gid,
                                parent)
                    break

    async def close(self) -> None:
        """Stop accepting, close every connection, remove the socket (if still ours)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._serving is not None:
            with contextlib.suppress(BaseException):
                self._server = await self._serving
            self._serving = None
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        if self.allow_group is not None:
            with contextlib.suppress(OSError):
                os.chmod(self.path.parent, 0o700)

    def stats(self) -> dict[str, Any]:
        conns = []
        for c in self.connections:
            conns.append({
                "pid": c.peer.pid if c.peer else None, "uid": c.peer.uid if c.peer else None,
                "subscriptions": len(c.subs), "waits": len(c.waiters),
                "write_buffer": c.unsent, "lagged": sum(c.lag.values()), "paused": c.paused,
                "receiving": c.reader.held,
            })
        lim = self.limits
        return {**self.counters, "connections": len(self.connections),
                "max_connections": self.max_connections, "max_request": self.max_request,
                "subscriber_buffer": self.subscriber_buffer, "receiving": self.receiving,
                "max_receiving": lim.max_receiving, "owner_reserve": self.reserve,
                "idle_timeout_s": lim.idle_timeout_s, "frame_timeout_s": lim.frame_timeout_s,
                "stall_timeout_s": lim.stall_timeout_s, "max_reply": lim.max_reply,
                "clients": conns}

    # -- budgets and deadlines ----------------------------------------------------------------
    def reserve_receiving(self, length: int) -> bool:
        """May one more large request frame of ``length`` bytes be received now?"""
        if self.receiving + length > self.limits.max_receiving:
            return False
        self.receiving += length
        return True

    def release_receiving(self, length: int) -> None:
        self.receiving = max(0, self.receiving - length)

    def check_long_lived(self, conn: Connection) -> None:
        """Raise unless ``conn`` may hold a subscription or a wait: those may never take the
        slots kept for short requests."""
        if conn.long_lived:
            return
        cap = self.max_connections - self.reserve
        held = sum(1 for c in self.connections if c.long_lived)
        if held >= cap:
            raise TooManyConnections(
                f"{held} connections already hold subscriptions or waits (the limit is {cap}; "
                f"the last {self.reserve} connections are kept for short requests); close "
                "some clients and try again")

    def _sweep(self) -> None:
        assert self.loop is not None
        now = monotonic()
        for conn in list(self.connections):
            conn.check_deadlines(now)
        self._sweeper = self.loop.call_later(self.limits.sweep_s, self._sweep)

    # -- connections --------------------------------------------------------------------------
    def admit(self, conn: Connection, peer: PeerCred | None) -> str | None:
        """None to let ``conn`` in, else the reason it is refused (already logged)."""
        if peer is None:
            self.counters["refused"] += 1
            self.ratelog.warning("nocred", "refused a control connection: no peer credentials")
            return "permission denied: cannot identify the peer"
        if not is_allowed(peer, owner_uid=self.owner_uid, group_gid=self.allow_group):
            self.counters["refused"] += 1
            why = refusal(peer, self.allow_group)
            self.ratelog.warning(f"uid{peer.uid}", f"refused a control connection from uid "
                                 f"{peer.uid} pid {peer.pid}: not allowed")
            return why
        conn.owner = peer.uid in (self.owner_uid, 0)
        if not conn.owner:
            others = sum(1 for c in self.connections if not c.owner)
            if others >= self.max_connections - self.reserve:
                self.counters["over_limit"] += 1
                self.ratelog.warning("flood-others", f"refused a control connection from "
                                     f"{user_name(peer.uid)} pid {peer.pid}: other users "
                                     f"already hold {others} connections (the last "
                                     f"{self.reserve} are kept for the engine's own user)")
                return (f"too many connections to the engine from other users (the limit is "
                        f"{self.max_connections - self.reserve}); close some clients and try "
                        "again")
        if len(self.connections) >= self.max_connections and not self._evict_one():
            self.counters["over_limit"] += 1
            self.ratelog.warning("flood", f"refused a control connection from pid {peer.pid}: "
                                 f"already {len(self.connections)} connections (the limit), "
                                 "all of them busy")
            return (f"too many connections to the engine (the limit is "
                    f"{self.max_connections}); close some clients and try again")
        self.connections.add(conn)
        self.counters["accepted"] += 1
        return None

    def _evict_one(self) -> bool:
        """Close a connection with nothing in flight to make room: first one that trickles
        (silent since it opened, or a frame begun long ago and still incomplete), then the
        one idle the longest, and a newcomer still saying hello last.  False when every
        connection is busy."""
        now = monotonic()
        idle = [c for c in self.connections if not c.busy]
        if not idle:
            return False

        def rank(c: Connection) -> tuple[int, float]:
            return (0 if c.dribbling(now) else 1 if c.hello else 2), c.last_active

        victim = min(idle, key=rank)
        victim.cut(f"the engine is at its limit of {self.max_connections} connections and "
                   "this one was idle the longest; it gave way to a new one", abort=False,
                   counter="evicted")
        return True


def _check_private_dir(directory: Path) -> None:
    """The socket's directory must be ours and writable by nobody else (see the module doc)."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise VramtuiError(f"cannot serve in {directory}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise VramtuiError(f"cannot serve in {directory}: it is not a directory (a link?); "
                           "set VRAMTUI_RUNTIME_DIR to a private directory")
    if st.st_uid != os.geteuid():
        raise VramtuiError(f"cannot serve in {directory}: it belongs to "
                           f"{user_name(st.st_uid)}, not to you; set VRAMTUI_RUNTIME_DIR to a "
                           "private directory")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise VramtuiError(f"cannot serve in {directory}: other users may write in it (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); chmod 700 it or set "
                           "VRAMTUI_RUNTIME_DIR to a private directory")
