"""The dashboard in a browser: the Textual app served over HTTP with textual-serve.

Each browser session runs ``vramtui --attach SOCKET`` in a process of its own, attached to
the engine over its control socket (so it is the same app, seeing the same engine, as in a
terminal).  It is mounted at ``/ui`` of the HTTP front door (``vramtui --serve --http``), or
served alone by ``vramtui web``.

Guarded like every route (see :mod:`supervisor.http.auth`): the engine's user only, or the
bearer token, which a browser cannot send as a header.  So the first load, ``/ui/?token=…``,
is answered with a redirect to ``/ui/`` and a session cookie (not the token) for ``/ui``.  The
WebSocket must come from a page of ours (its whole ``Origin`` is checked), the page is never
loaded for another site nor shown in a frame (it would take the user's clicks and keys: see
:data:`NO_FRAMES`), and at most ``sessions`` browsers run at once, each a TUI process.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from supervisor.http.auth import DECISION

UI_PREFIX = "/ui"
PAGE_DIR = Path(__file__).resolve().parent / "webpage"  # the page each browser loads
#: The page drives the TUI: no page (of another site, or ours) may frame it, where a user's
#: clicks and keys meant for what shows on top would go to the TUI underneath.
NO_FRAMES = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


def ui_command(socket: Path, *, readonly: bool = False) -> str:
    """The shell command each browser session runs (textual-serve runs it with a shell).  The
    session's TUI exits once this process is gone (it is not always told: an abrupt stop of
    the server leaves it orphaned)."""
    from .app.app import WEB_PARENT_ENV

    argv = [sys.executable, "-m", "vramtui", "--attach", str(socket)]
    if readonly:
        argv.append("--readonly")
    return f"{WEB_PARENT_ENV}={os.getpid()} exec {shlex.join(argv)}"


def make_ui_app(command: str, *, sessions: int = 4, title: str = "vramtui") -> web.Application:
    """An aiohttp application serving the TUI; mount it with ``add_subapp(UI_PREFIX, …)``."""
    import aiohttp_jinja2
    import jinja2
    from textual_serve.server import Server

    server = Server(command, title=title)
    state: dict[str, int] = {"sessions": 0}

    async def index(request: web.Request) -> web.StreamResponse:
        decision = request.get(DECISION)
        if "token" in request.query:  # the first load: the token leaves the URL at once
            rest = urlencode([(k, v) for k, v in request.query.items() if k != "token"])
            redirect = web.HTTPSeeOther(f"{UI_PREFIX}/" + (f"?{rest}" if rest else ""))
            if decision is not None and decision.ui_cookie is not None:
                name, value = decision.ui_cookie
                redirect.set_cookie(name, value, httponly=True, samesite="Strict",
                                    path=UI_PREFIX, secure=request.secure)
            redirect.headers["Cache-Control"] = "no-store"
            redirect.headers["Referrer-Policy"] = "no-referrer"
            raise redirect
        router = request.app.router
        scheme = "wss" if request.secure else "ws"
        ws_path = router["websocket"].url_for()
        static = str(router["static"].url_for(filename="/")).rstrip("/") + "/"
        context: dict[str, Any] = {
            "font_size": _int(request.query.get("fontsize"), 16),
            "app_websocket_url": f"{scheme}://{request.host}{ws_path}",
            "config": {"static": {"url": static}},
            "application": {"name": title},
            "ping_url": "",
        }
        response = aiohttp_jinja2.render_template("index.html", request, context)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.update(NO_FRAMES)
        return response

    async def websocket(request: web.Request) -> web.StreamResponse:
        if state["sessions"] >= sessions:
            raise web.HTTPServiceUnavailable(
                text=f"already {sessions} dashboards open in browsers (the limit)")
        state["sessions"] += 1
        try:
            return await server.handle_websocket(request)
        finally:
            state["sessions"] -= 1

    app = web.Application()
    # Our own page (a title, an inline icon, the font from textual-serve's own statics): it
    # asks nothing of any other host.  The statics themselves are textual-serve's.
    aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(str(PAGE_DIR)))
    app.add_routes([
        web.get("", index, name="index"),
        web.get("/", index),
        web.get("/ws", websocket, name="websocket"),
        web.get("/download/{key}", server.handle_download, name="download"),
        web.static("/static", server.statics_path, name="static"),
    ])
    return app


def available() -> str | None:
    """None when the browser dashboard can be served, else what to install."""
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        return "the browser dashboard needs textual-serve: pip install 'vramtui[http]'"
    return None


def _int(raw: str | None, default: int) -> int:
    return int(raw) if raw and raw.isdigit() and 6 <= int(raw) <= 64 else default


def run_web(args: Any) -> int:
    """``vramtui web``: the dashboard alone on ``--http``, attached to the running engine."""
    import asyncio

    from supervisor.http import expect
    from supervisor.http.auth import Guard
    from supervisor.http.config import HttpConfigError, bind_sockets, load_http_config
    from supervisor.http.errors import HttpError
    from supervisor.http.gate import ConnectionGate, GatedSite

    from .connect import control_socket
    from .exits import Exit

    missing = available()  # aiohttp's absence: vramtui.cli.web says it, as this imports it
    if missing is not None:
        print(f"vramtui web: {missing}", file=sys.stderr)
        return Exit.USAGE
    try:
        from .cli.web import DEFAULT_LISTEN

        config = load_http_config(listen=getattr(args, "http", None) or DEFAULT_LISTEN,
                                  token_file=getattr(args, "http_token_file", None))
    except HttpConfigError as exc:
        print(f"vramtui web: {exc}", file=sys.stderr)
        return Exit.USAGE
    assert config is not None
    socket = control_socket(args)
    if not socket.exists():
        print(f"vramtui web: no engine answers at {socket}; start one (vramtui --serve), or "
              "give --attach", file=sys.stderr)
        return Exit.NO_ENGINE
    guard = Guard(config)
    gate = ConnectionGate(config.connections)

    @web.middleware
    async def guarded(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            request[DECISION] = guard.check(request)
        except HttpError as exc:
            return exc.response()
        return await handler(request)

    async def main() -> None:
        app = web.Application(middlewares=[gate.middleware, guarded, expect.middleware])

        async def root(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(UI_PREFIX + "/" + (f"?{request.query_string}"
                                                   if request.query_string else ""))

        app.router.add_get("/", root)
        app.add_subapp(UI_PREFIX, make_ui_app(ui_command(socket, readonly=args.readonly),
                                              sessions=config.ui_sessions))
        socks = bind_sockets(config.listen)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        for sock in socks:  # its address, and localhost's other one (bind_sockets)
            await GatedSite(runner, sock, gate).start()
        host, port = socks[0].getsockname()[:2] if not config.listen.path else ("", 0)
        where = config.listen.url() if config.listen.path else \
            f"http://{f'[{host}]' if ':' in host else host}:{port}"
        print(f"vramtui web: the dashboard on {where}{UI_PREFIX}/ (attached to {socket}); "
              "Ctrl-C stops it", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"vramtui web: cannot listen on {config.listen.url()}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return Exit.FAILED
    except KeyboardInterrupt:
        pass
    return Exit.OK

