"""``vramtui web``: the dashboard in a browser, attached to the running engine.

The arguments live here, with the names ``--serve`` gives them (``--http``,
``--http-token-file``); the server is :func:`vramtui.web.run_web` (the dashboard's app is also
what ``--serve --http`` serves at ``/ui``).
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_LISTEN = "127.0.0.1:8081"


def arguments(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: nothing set unless given, so the command's flags never blank --serve's.
    p.add_argument("--http", default=argparse.SUPPRESS, metavar="ADDR",
                   help=f"where to listen, as --serve --http takes it (default {DEFAULT_LISTEN};"
                        " anything but loopback needs a token)")
    p.add_argument("--http-token-file", default=argparse.SUPPRESS, metavar="FILE",
                   help="the bearer token (or VRAMTUI_HTTP_TOKEN); open /ui/?token=TOKEN once")
    # The names it had before: still taken, no longer shown.
    p.add_argument("--listen", dest="http", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--token-file", dest="http_token_file", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)
    p.add_argument("--readonly", action="store_true",
                   help="the browser may look but change nothing")


def run(args: argparse.Namespace) -> int:
    from supervisor.http import available

    missing = available()
    if missing is not None:  # asked before vramtui.web, which imports aiohttp as it loads
        from ..exits import Exit

        print(f"vramtui web: {missing}", file=sys.stderr)
        return Exit.USAGE
    from ..web import run_web

    return run_web(args)
