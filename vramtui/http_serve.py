"""``vramtui --serve --http ADDR``: the HTTP front door as one more service on the engine loop.

:func:`http_settings` reads ``--http`` / ``--http-token-file`` over ``config.yaml``'s
``http:`` section (None: not asked for), checking everything before the engine starts;
:func:`add_http` adds the server — with the browser dashboard at ``/ui`` when textual-serve
is installed — and prints ``vramtui: HTTP front door on URL`` once it listens.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from supervisor.errors import VramtuiError
from supervisor.facade import Supervisor
from supervisor.paths import Paths

from . import __version__

if TYPE_CHECKING:
    from supervisor.http.config import HttpConfig

log = logging.getLogger("vramtui")

# What --serve prints once the front door listens; scripts and tests read its URL back with
# front_door_url (one owner of the line's shape).
FRONT_DOOR = "vramtui: HTTP front door on "


def front_door_url(output: str) -> str | None:
    """The front door's base URL in ``--serve``'s output, or None before it listens."""
    for line in output.splitlines():
        if line.startswith(FRONT_DOOR):
            return line[len(FRONT_DOOR):].split()[0]
    return None


def http_settings(args: argparse.Namespace, paths: Paths) -> HttpConfig | None:
    """The front door's settings, or None when neither the flags nor the config ask for it."""
    from supervisor.http import available
    from supervisor.http.config import load_http_config

    listen = getattr(args, "http", None)
    token_file = getattr(args, "http_token_file", None)
    config = load_http_config(listen=listen, token_file=token_file,
                              config_file=paths.settings_file)
    if config is None:
        if token_file:
            raise VramtuiError("--http-token-file goes with --http ADDR (or an http: section "
                               f"in {paths.settings_file})")
        return None
    missing = available()
    if missing is not None:
        raise VramtuiError(missing)
    return config


def add_http(sup: Supervisor, config: HttpConfig) -> None:
    from supervisor.http.server import HttpServer

    subapps = {}
    if config.ui:
        from .web import UI_PREFIX, available, make_ui_app, ui_command

        if available() is None:
            subapps[UI_PREFIX] = make_ui_app(ui_command(sup.paths.control_socket),
                                             sessions=config.ui_sessions)
        else:
            log.info("no browser dashboard at /ui: %s", available())

    def ready(server: HttpServer) -> None:
        print(f"{FRONT_DOOR}{server.address}"
              + (f" (dashboard: {server.address}/ui/)" if subapps else ""), flush=True)

    sup.add_service(HttpServer(sup.engine, config, version=__version__, subapps=subapps,
                               on_ready=ready))
