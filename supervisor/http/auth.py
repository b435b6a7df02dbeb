"""Who may do what over HTTP: one decision per request, made before any route runs.

- A valid ``Authorization: Bearer TOKEN`` (when a token is set) lets anyone in.
- Without one: a peer on another machine is refused (401); a local peer (loopback or the Unix
  socket) must be the engine's own user or root — checked by uid, as on the control socket,
  because on a shared machine every user can reach 127.0.0.1 (403 otherwise); and when a token
  is set, local peers may only read (GET / HEAD) without it — and not the browser
  dashboard, whose WebSocket drives the whole TUI.
- ``/healthz`` and ``/readyz`` answer anyone: they say nothing but up / ready.
- A browser must not be turned against us: the ``Host`` header must name this server (a
  loopback name, the bind address or ``allowed_hosts``), which defeats DNS rebinding, and a
  request that carries an ``Origin`` must come from that same host, which defeats cross-site
  POSTs and WebSocket hijacking from another page.  Clients that are not browsers send no
  ``Origin`` and are not affected.

The browser dashboard cannot send a header: ``/ui?token=…`` sets a same-site cookie holding
the token, which then counts as the header for ``/ui`` only.
"""

from __future__ import annotations

import hmac
import os
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from .config import HttpConfig, is_loopback
from .errors import HttpError
from .peer import Peer, identify

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UI_COOKIE = "vramtui_token"
UI_PREFIX = "/ui"


@dataclass(frozen=True, slots=True)
class Decision:
    peer: Peer
    token_ok: bool


DECISION = web.RequestKey("decision", Decision)


class Guard:
    """The policy for one server (its config, its bind address, its owner)."""

    def __init__(self, config: HttpConfig, owner_uid: int | None = None) -> None:
        self.config = config
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self._peers: weakref.WeakKeyDictionary[Any, Peer] = weakref.WeakKeyDictionary()
        hosts = {"localhost", "127.0.0.1", "::1", *config.allowed_hosts}
        if config.listen.host:
            hosts.add(config.listen.host.lower())
        self.hosts = frozenset(hosts)

    def peer(self, request: web.Request) -> Peer:
        transport = request.transport
        if transport is None:
            return Peer(False, None, "gone")
        try:
            peer = self._peers.get(transport)
        except TypeError:  # a transport that cannot be weakly referenced: ask each time
            return identify(transport)
        if peer is None:
            peer = identify(transport)
            self._peers[transport] = peer
        return peer

    def host_ok(self, request: web.Request) -> bool:
        if self.config.listen.path is not None:
            return True  # a Unix socket: no browser reaches it by a name
        host = request.headers.get("Host", "")
        name = _host_name(host)
        if not name:
            return False
        return name in self.hosts or is_loopback(name) or (
            "*" in self.config.allowed_hosts)

    def origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        if origin == "null":
            return False
        parts = urlsplit(origin)
        name = (parts.hostname or "").lower()
        if not name:
            return False
        if self.config.listen.path is None:
            # Same origin: the page was served by us, under the name the browser used.
            return name == _host_name(request.headers.get("Host", "")) and self.host_ok(request)
        return is_loopback(name)

    def token_from(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        if _is_ui(request.path):
            return request.query.get("token") or request.cookies.get(UI_COOKIE)
        return None

    def check(self, request: web.Request) -> Decision:
        """Let ``request`` through (its :class:`Decision`) or raise :class:`HttpError`."""
        if not self.host_ok(request):
            raise HttpError(403, f"Host {request.headers.get('Host', '')!r} is not this "
                            "server's name; add it to http.allowed_hosts if it is",
                            "permission_error", "bad_host")
        if not self.origin_ok(request):
            raise HttpError(403, f"cross-origin request from {request.headers.get('Origin')!r} "
                            "refused", "permission_error", "bad_origin")
        expected = self.config.token
        given = self.token_from(request)
        token_ok = bool(expected and given and hmac.compare_digest(
            given.encode(), expected.encode()))
        peer = self.peer(request)
        if request.path in OPEN_PATHS:
            return Decision(peer, token_ok)
        if given is not None and expected and not token_ok:
            raise _unauthorized("the bearer token is wrong")
        if token_ok:
            return Decision(peer, True)
        if not peer.local:
            raise _unauthorized("a bearer token is needed from another machine "
                                "(Authorization: Bearer TOKEN)")
        if peer.uid is None or (peer.uid != self.owner_uid and peer.uid != 0):
            raise HttpError(403, f"permission denied: {peer.describe()} is not the engine's "
                            f"user (uid {self.owner_uid}); send the bearer token",
                            "permission_error", "not_owner")
        if expected and (request.method not in READ_METHODS or _is_ui(request.path)):
            raise _unauthorized(f"{request.method} {request.path} changes the engine: send "
                                "the bearer token (Authorization: Bearer TOKEN)")
        return Decision(peer, False)


def _is_ui(path: str) -> bool:
    """The browser dashboard: its WebSocket drives the whole TUI, so it counts as mutating."""
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _unauthorized(message: str) -> HttpError:
    return HttpError(401, message, "authentication_error", "unauthorized",
                     headers={"WWW-Authenticate": 'Bearer realm="vramtui"'})


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
