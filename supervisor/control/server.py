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

Limits: a request frame over ``max_request`` bytes is read and thrown away and answered with
an error naming the limit; a subscriber that does not read stops receiving events once its
write buffer is over ``subscriber_buffer`` bytes and is sent the latest snapshot (and the number
of events it missed) when it catches up; at most ``max_connections`` clients at a time, more are
told so and closed (logged, at most once every few seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import VramtuiError
from . import messages as m
from .connection import Connection
from .methods import Methods
from .peer import PeerCred, is_allowed, refusal

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("supervisor.control")

SUBSCRIBER_BUFFER = 256 * 1024


class _RateLog:
    """Log a recurring warning at most once per ``period`` seconds, counting the rest."""

    def __init__(self, period: float = 5.0) -> None:
        self.period = period
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, text: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -1e9) < self.period:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        extra = self._suppressed.pop(key, 0)
        self._last[key] = now
        log.warning("%s%s", text, f" (and {extra} more like it)" if extra else "")

class ControlServer:
    """Serves one engine on ``socket_path``; a facade service (``start`` / ``close``)."""

    def __init__(self, engine: Engine, socket_path: str | os.PathLike[str], *,
                 mode: str = "serve", version: str = "", allow_group: int | None = None,
                 max_request: int = m.DEFAULT_MAX_REQUEST,
                 max_connections: int = m.DEFAULT_MAX_CONNECTIONS,
                 subscriber_buffer: int = SUBSCRIBER_BUFFER,
                 on_ready: Callable[[ControlServer], None] | None = None) -> None:
        self.engine = engine
        self.path = Path(socket_path)
        self.mode = mode
        self.version = version
        self.allow_group = allow_group
        self.max_request = max_request
        self.max_connections = max_connections
        self.subscriber_buffer = subscriber_buffer
        self.on_ready = on_ready
        self.owner_uid = os.geteuid()
        self.connections: set[Connection] = set()
        self.counters = {"accepted": 0, "refused": 0, "over_limit": 0, "oversized": 0,
                         "dropped_events": 0, "requests": 0}
        self.ratelog = _RateLog()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._server: asyncio.AbstractServer | None = None
        self._serving: asyncio.Task[asyncio.AbstractServer] | None = None
        self.methods = Methods(self)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Bind and listen now (on the engine loop); connections are accepted from the next
        iteration.  Raises OSError / VramtuiError with a one-line message."""
        self.loop = asyncio.get_running_loop()
        path = str(self.path)
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
            transport = c.transport
            conns.append({
                "pid": c.peer.pid if c.peer else None, "uid": c.peer.uid if c.peer else None,
                "subscriptions": len(c.subs), "write_buffer": (
                    transport.get_write_buffer_size() if transport is not None else 0),
                "lagged": sum(c.lag.values()), "paused": c.paused,
            })
        return {**self.counters, "connections": len(self.connections),
                "max_connections": self.max_connections, "max_request": self.max_request,
                "subscriber_buffer": self.subscriber_buffer, "clients": conns}

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
        if len(self.connections) >= self.max_connections:
            self.counters["over_limit"] += 1
            self.ratelog.warning("flood", f"refused a control connection from pid {peer.pid}: "
                                 f"already {len(self.connections)} connections (the limit)")
            return (f"too many connections to the engine (the limit is "
                    f"{self.max_connections}); close some clients and try again")
        self.connections.add(conn)
        self.counters["accepted"] += 1
        return None
