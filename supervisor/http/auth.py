"""Who may do what over HTTP: one decision per request, made before any route runs.

- A valid ``Authorization: Bearer TOKEN`` (when a token is set) lets anyone in.
- Without one: a peer on another machine is refused (401); a local peer (loopback or the Unix
  socket) must be the engine's own user, checked by uid as the connection was accepted (see
  :mod:`.peer`; root counts only on the Unix socket, where the kernel vouches for the uid), or
  it is refused (403); and when a token is set, local peers may only read (GET / HEAD)
  without it, and not the browser dashboard, whose WebSocket drives the whole TUI.
- ``/healthz``, ``/readyz`` (and llama-swap's ``/health``) answer anyone: they say nothing
  but up / ready.  A route whose ``GET`` changes the engine is marked :func:`changes_engine`
  and guarded as a ``POST`` is, whatever its method: llama-swap's ``GET /unload``, and
  ``/upstream/{model}/…`` (any request there starts the model's server, maybe evicting others,
  and reaches a server whose ``GET`` may change it too).
- A browser must not be turned against us.  The ``Host`` header must name this server (a
  loopback name, the bind address or ``allowed_hosts``), which defeats DNS rebinding.  A
  request that carries an ``Origin`` must come from this very origin, compared whole:
  scheme, host and port (a page on another port of the same host is another origin, and
  another user's or a dev server's page may be served there).  A non-GET request or a
  WebSocket whose ``Sec-Fetch-Site`` says it crosses sites is refused even without an
  ``Origin``.  Clients that are not browsers send neither header and are not affected.
  The dashboard (``/ui``) counts as a change whatever the method: its page, loaded in a
  frame of another site, would take the user's clicks and keys (clickjacking), so another
  site may not load it at all (and its page forbids every frame: ``vramtui.web``).

The browser dashboard cannot send a header.  Its first load, ``/ui/?token=…``, is answered
with a redirect to ``/ui/`` (the token leaves the address bar and the history) and a cookie
that is not the token: an opaque session value, under a cookie name drawn at each start, bound
to the peer it was given to (its local uid, or its remote address).  A cookie is sent to every
port of a host, so a page or server on another port may see it; it is worth nothing there,
and nothing to another user here.  It counts for ``/ui`` only.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from supervisor.clock import monotonic

from ..errors import brief
from .config import HttpConfig, is_loopback
from .errors import HttpError
from .gate import GatedHandler
from .peer import Peer, identify

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/health"})
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UI_PREFIX = "/ui"
UI_SESSIONS_MAX = 64
UI_SESSION_S = 24 * 3600.0
CROSSING = frozenset({"cross-site", "same-site"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class Decision:
    peer: Peer
    token_ok: bool
    # (name, value) of the dashboard's session cookie to set: the first load with ?token=
    ui_cookie: tuple[str, str] | None = None


DECISION = web.RequestKey("decision", Decision)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The policy for one server (its config, its bind address, its owner)."""

    def __init__(self, config: HttpConfig, owner_uid: int | None = None) -> None:
        self.config = config
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        hosts = {"localhost", "127.0.0.1", "::1", *config.allowed_hosts}
        if config.listen.host:
            hosts.add(config.listen.host.lower())
        self.hosts = frozenset(hosts)
        self.ui_cookie = f"vramtui_ui_{secrets.token_hex(8)}"
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def peer(self, request: web.Request) -> Peer:
        """Who sent ``request``: as identified when its connection was accepted."""
        proto = request.protocol
        if isinstance(proto, GatedHandler) and proto.peer is not None:
            return proto.peer
        transport = request.transport
        if transport is None:
            return Peer(False, None, "gone")
        return identify(transport)

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
        """No Origin, or exactly this server's origin (scheme, host, port)."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        theirs = _origin(origin)
        return theirs is not None and theirs == _own_origin(request)

    def crosses_sites(self, request: web.Request) -> bool:
        """A browser says a request that changes something comes from another site."""
        if _reads(request) and request.headers.get("Upgrade", "").lower() != "websocket":
            return False
        return request.headers.get("Sec-Fetch-Site", "").lower() in CROSSING

    def _token_ok(self, given: str | None) -> bool:
        expected = self.config.token
        return bool(expected and given and hmac.compare_digest(given.encode(),
                                                                expected.encode()))

    def _new_session(self, peer: Peer) -> tuple[str, str]:
        value = secrets.token_urlsafe(32)
        self._sessions[value] = (peer.key, monotonic() + UI_SESSION_S)
        while len(self._sessions) > UI_SESSIONS_MAX:
            self._sessions.popitem(last=False)
        return self.ui_cookie, value

    def _session_ok(self, value: str | None, peer: Peer) -> bool:
        if not value:
            return False
        held = self._sessions.get(value)
        if held is None:
            return False
        key, until = held
        if monotonic() > until:
            del self._sessions[value]
            return False
        return hmac.compare_digest(key, peer.key)

    def check(self, request: web.Request) -> Decision:
        """Let ``request`` through (its :class:`Decision`) or raise :class:`HttpError`."""
        if not self.host_ok(request):
            raise HttpError(403, f"Host {brief(request.headers.get('Host', ''))} is not this "
                            "server's name; add it to http.allowed_hosts if it is",
                            "permission_error", "bad_host")
        if not self.origin_ok(request) or self.crosses_sites(request):
            origin = request.headers.get("Origin") or request.headers.get("Sec-Fetch-Site")
            raise HttpError(403, f"cross-origin request from {brief(origin)} refused: only pages "
                            f"of this server ({_show(_own_origin(request))}) may send it",
                            "permission_error", "bad_origin")
        peer = self.peer(request)
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        given = value.strip() if scheme.lower() == "bearer" and value.strip() else None
        token_ok = self._token_ok(given)
        cookie: tuple[str, str] | None = None
        if given is None and _is_ui(request.path):
            first = request.query.get("token")
            if first is not None:
                given = first
                token_ok = self._token_ok(first)
                if token_ok:
                    cookie = self._new_session(peer)
            else:
                token_ok = self._session_ok(request.cookies.get(self.ui_cookie), peer)
        if request.path in OPEN_PATHS:
            return Decision(peer, token_ok)
        if given is not None and self.config.token and not token_ok:
            raise _unauthorized("the bearer token is wrong")
        if token_ok:
            return Decision(peer, True, cookie)
        if not peer.local:
            raise _unauthorized("a bearer token is needed from another machine "
                                "(Authorization: Bearer TOKEN)")
        if not peer.is_user(self.owner_uid):
            raise HttpError(403, f"permission denied: {peer.describe()} is not the engine's "
                            f"user (uid {self.owner_uid}); send the bearer token",
                            "permission_error", "not_owner")
        if self.config.token and not _reads(request):
            raise _unauthorized(f"{request.method} {request.path} changes the engine: send "
                                "the bearer token (Authorization: Bearer TOKEN)")
        return Decision(peer, False)


def changes_engine(handler: Handler) -> Handler:
    """Mark a route whose every method changes the engine (a ``GET`` included): the guard
    treats it as a ``POST`` (no cross-site request, the token in token mode)."""
    handler.changes_engine = True  # type: ignore[attr-defined]
    return handler


def _reads(request: web.Request) -> bool:
    """A request that only reads: a GET (HEAD, OPTIONS) of a route not marked
    :func:`changes_engine`, outside the browser dashboard.  The dashboard's page opens the
    WebSocket that drives the whole TUI as soon as it loads, so loading it is a change too:
    a page of another site that framed it (an ``<iframe>``, invisible, under its own
    buttons) would have the user's clicks and keys drive the TUI."""
    if _is_ui(request.path):
        return False
    route_handler = getattr(request.match_info, "handler", None)
    return request.method in READ_METHODS and not getattr(route_handler, "changes_engine",
                                                          False)


def _is_ui(path: str) -> bool:
    """The browser dashboard: its WebSocket drives the whole TUI, so it counts as mutating
    (:func:`_reads`)."""
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _unauthorized(message: str) -> HttpError:
    return HttpError(401, message, "authentication_error", "unauthorized",
                     headers={"WWW-Authenticate": 'Bearer realm="vramtui"'})


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _origin(text: str) -> tuple[str, str, int] | None:
    """``scheme://host[:port]`` as (scheme, host, port); None when it is not one."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def _own_origin(request: web.Request) -> tuple[str, str, int] | None:
    """This server's origin as the browser addressed it: its scheme and its Host header."""
    scheme = "https" if request.secure else "http"
    return _origin(f"{scheme}://{request.headers.get('Host', '')}")


def _show(origin: Any) -> str:
    if origin is None:
        return "?"
    scheme, host, port = origin
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"
